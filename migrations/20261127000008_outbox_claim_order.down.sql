drop index dispatch_outbox_todo_idx;
create index dispatch_outbox_todo_idx on dispatch_outbox (not_before, id) where done_at is null;
