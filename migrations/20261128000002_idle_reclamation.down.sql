drop table idle_spans;
drop table idle_policies;
