-- The transaction that last changed what the scheduler reads of a job. It is set when the
-- row is inserted, whenever its `version` is bumped (every change of state, attempt,
-- placement or timing bumps it) and when a checkpoint is recorded; the pending reason,
-- position and expected start a cycle records do not set it.
--
-- The leader keeps the live jobs in memory and each cycle reads only the rows changed by
-- transactions its previous snapshot could not have seen: `changed_in >= xmin` of that
-- snapshot. Every transaction below that xmin had ended, so its changes were in the copy;
-- an ID is assigned to a writing transaction before it writes, so one that was running,
-- or that starts later, has an ID at or above it (see `db::scheduling::snapshot_rows`).
alter table jobs add column changed_in xid8 not null default pg_current_xact_id();

create function jobs_mark_changed() returns trigger language plpgsql as $$
begin
    new.changed_in := pg_current_xact_id();
    return new;
end $$;

create trigger jobs_mark_changed before update of version, last_checkpoint_at on jobs
    for each row execute function jobs_mark_changed();

create index jobs_changed_in_idx on jobs (changed_in);
