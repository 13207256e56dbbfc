alter table jobs drop column expected_runtime_seconds;
