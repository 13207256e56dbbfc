-- What a submission is validated against, kept with the inventory: per cluster and GPU class,
-- the largest node, NVLink domain, rack and zone. A submission then reads one row per cluster
-- and class instead of aggregating every node of the class.
alter table cluster_capacity
    add column largest_node          integer not null default 0,
    add column largest_nvlink_domain integer not null default 0,
    add column largest_rack          integer not null default 0,
    add column largest_zone          integer not null default 0;

update cluster_capacity c
set largest_node = s.largest_node,
    largest_nvlink_domain = s.largest_nvlink_domain,
    largest_rack = s.largest_rack,
    largest_zone = s.largest_zone
from (
    select n.cluster_id, n.gpu_class_id,
           max(n.gpus) as largest_node,
           max(case when n.nvlink_domain_size = 0 or n.elastic then n.gpus
                    else least(n.gpus, n.nvlink_domain_size) end) as largest_nvlink_domain,
           (select max(s) from (select sum(r.gpus) as s from cluster_nodes r
                                where r.cluster_id = n.cluster_id and r.gpu_class_id = n.gpu_class_id
                                group by coalesce(r.rack, r.name)) x)::int4 as largest_rack,
           (select max(s) from (select sum(z.gpus) as s from cluster_nodes z
                                where z.cluster_id = n.cluster_id and z.gpu_class_id = n.gpu_class_id
                                group by coalesce(z.zone, z.name)) x)::int4 as largest_zone
    from cluster_nodes n
    group by n.cluster_id, n.gpu_class_id
) s
where c.cluster_id = s.cluster_id and c.gpu_class_id = s.gpu_class_id;
