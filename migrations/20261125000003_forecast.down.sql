drop index jobs_forecast_idx;
drop index jobs_finished_idx;
alter table jobs drop column forecast_wait_ms, drop column forecast_at;
