alter table cluster_capacity
    drop column largest_node,
    drop column largest_nvlink_domain,
    drop column largest_rack,
    drop column largest_zone;
