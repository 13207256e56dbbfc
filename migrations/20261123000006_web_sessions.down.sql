drop table web_sessions;
