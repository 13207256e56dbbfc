drop trigger teams_parent_catalogue on teams;
drop trigger quotas_catalogue on quotas;
