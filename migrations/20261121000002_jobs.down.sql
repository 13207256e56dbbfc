drop table sim_objects;
drop table usage_intervals;
drop table scheduler_leader;
drop table dispatch_outbox;
drop table job_events;
drop table jobs;
drop table cluster_nodes;
alter table priority_classes drop column preemption_grace_seconds;
alter table teams drop column fair_share_weight_milli, drop column max_runtime_seconds;
