-- Elastic cloud pools (AWS Batch, Google Cloud Batch) have a price of their own and may be
-- spot capacity; jobs say whether they tolerate spot; usage on a pool is metered at its price.

alter table cluster_nodes
    add column spot boolean not null default false,
    -- Micro-units per GPU-hour; null means the rate card prices the class.
    add column price_micros_per_gpu_hour bigint
        constraint cluster_nodes_price_check check (price_micros_per_gpu_hour >= 0);

alter table jobs
    add column allow_spot boolean not null default false;

-- The price the attempt runs at when its pool has one, fixed when the interval opens.
alter table usage_intervals
    add column rate_micros_per_gpu_hour bigint
        constraint usage_intervals_rate_check check (rate_micros_per_gpu_hour >= 0);
