alter table usage_intervals drop column rate_micros_per_gpu_hour;
alter table jobs drop column allow_spot;
alter table cluster_nodes drop column price_micros_per_gpu_hour, drop column spot;
