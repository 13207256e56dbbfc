-- Nodes whose GPUs report a fault (a Kubernetes node condition or taint as NVSentinel sets
-- them), replaced whole at each inventory sync of their cluster, for the cluster view.
create table node_faults (
    cluster_id uuid not null constraint node_faults_cluster_id_fkey references clusters (id) on delete cascade,
    node       text not null,
    since      timestamptz not null,
    why        text not null,
    primary key (cluster_id, node)
);
