-- Job arrays (Slurm's --array, Kubernetes' Indexed Jobs): one submission of `task_count`
-- tasks that differ only in their index. Each task is a job of its own (its own attempts,
-- retries, state, bill and timeline), so the scheduler sees an array's tasks exactly as it
-- sees separate jobs; the array row holds what they share and how many may be under way.
create table job_arrays (
    id           uuid primary key,
    team_id      uuid not null constraint job_arrays_team_id_fkey references teams (id) on delete cascade,
    name         text not null,
    task_count   int4 not null constraint job_arrays_task_count_check check (task_count between 1 and 10000),
    -- At most this many tasks are released to the queue or running at once; null: all.
    parallelism  int4 constraint job_arrays_parallelism_check check (parallelism between 1 and task_count),
    submitted_by text not null,
    submitted_at timestamptz not null default now(),
    seq          bigserial not null
);
create index job_arrays_team_id_seq_idx on job_arrays (team_id, seq);

alter table jobs add column array_id uuid
    constraint jobs_array_id_fkey references job_arrays (id) on delete cascade;
alter table jobs add column array_index int4;
alter table jobs add constraint jobs_array_task_check check ((array_id is null) = (array_index is null));
-- One task per index; also the read of an array's tasks in index order.
create unique index jobs_array_id_index_idx on jobs (array_id, array_index) where array_id is not null;
-- True while the array's parallelism holds the task back: the scheduler's snapshot skips
-- it, and the leader's array pass releases held tasks in index order as earlier ones end.
-- The partial index is empty when no array is limited.
alter table jobs add column held_by_array boolean not null default false;
create index jobs_held_by_array_idx on jobs (array_id, array_index) where held_by_array;
