drop table job_log_cursors;
drop table job_logs;
