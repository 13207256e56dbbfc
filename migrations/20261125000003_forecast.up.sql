-- What the expected starts learn from (`scheduler::runtime` and `scheduler::forecast_errors`):
-- the forecast a job was given when it first waited in its current stay in the queue (the
-- play's median wait, before calibration), compared later with when it was admitted.
alter table jobs add column forecast_at timestamptz,
                 add column forecast_wait_ms bigint;
-- The runtimes of recently finished jobs, newest first.
create index jobs_finished_idx on jobs (finished_at) where state in ('succeeded', 'failed');
-- The errors of recent forecasts, newest admission first.
create index jobs_forecast_idx on jobs (admitted_at) where forecast_at is not null;
