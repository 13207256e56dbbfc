drop table node_faults;
