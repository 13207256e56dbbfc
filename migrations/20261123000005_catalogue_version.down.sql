drop trigger teams_catalogue on teams;
drop trigger cluster_capacity_catalogue on cluster_capacity;
drop trigger gpu_classes_catalogue on gpu_classes;
drop trigger priority_classes_catalogue on priority_classes;
drop function bump_catalogue_version();
drop table catalogue_version;
