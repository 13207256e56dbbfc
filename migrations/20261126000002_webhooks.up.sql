-- Per-team webhooks: where a team's notifications go, signed with the Standard Webhooks
-- scheme (https://www.standardwebhooks.com). The secret is kept: every delivery is signed
-- with it, and it is shown once, in the answer that created the webhook.
create table webhooks (
    id         uuid primary key,
    team_id    uuid not null constraint webhooks_team_id_fkey references teams (id) on delete cascade,
    url        text not null,
    -- `whsec_` + base64 of 24 random bytes.
    secret     text not null,
    -- Event types on the wire: job.succeeded, job.failed, job.preempted, job.requeued,
    -- job.cancelled, budget.threshold.
    events     text[] not null constraint webhooks_events_check check (cardinality(events) > 0),
    format     text not null default 'standard' constraint webhooks_format_check check (format in ('standard', 'slack')),
    created_by uuid constraint webhooks_created_by_fkey references users (id) on delete set null,
    created_at timestamptz not null default now()
);
create index webhooks_team_id_idx on webhooks (team_id, id);

-- One message to one webhook, written by the notifier in the transaction that advances its
-- cursor, and retried by the delivery worker with the same message id until it is delivered
-- or out of attempts.
create table webhook_deliveries (
    id              bigint generated always as identity primary key,
    webhook_id      uuid not null constraint webhook_deliveries_webhook_id_fkey references webhooks (id) on delete cascade,
    -- `webhook-id` on the wire: the same for every attempt, so receivers can drop duplicates.
    message_id      text not null,
    event_type      text not null,
    payload         jsonb not null,
    state           text not null default 'pending'
                    constraint webhook_deliveries_state_check check (state in ('pending', 'delivered', 'failed')),
    attempts        integer not null default 0,
    -- When a pending delivery is next due; a claimed one is pushed a lease ahead, so a crash
    -- mid-request means a retry once the lease ends.
    next_attempt_at timestamptz not null default now(),
    last_status     integer,
    last_error      text,
    created_at      timestamptz not null default now(),
    delivered_at    timestamptz,
    constraint webhook_deliveries_message_key unique (webhook_id, message_id)
);
create index webhook_deliveries_due_idx on webhook_deliveries (next_attempt_at) where state = 'pending';
create index webhook_deliveries_webhook_idx on webhook_deliveries (webhook_id, id);

-- How far the notifier has read: one row.
create table webhook_cursor (
    singleton     boolean primary key default true constraint webhook_cursor_singleton_check check (singleton),
    last_event_id bigint not null,
    last_alert_at timestamptz not null
);
-- Events and alerts from before webhooks existed notify no one.
insert into webhook_cursor (last_event_id, last_alert_at)
select coalesce((select max(id) from job_events), 0), coalesce((select max(raised_at) from budget_alerts), now());
