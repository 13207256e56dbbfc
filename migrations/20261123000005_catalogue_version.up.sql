-- A version of what job submissions are validated against (priority classes, GPU classes,
-- per-class capacity, teams' runtime limits), bumped in the transaction of every change to
-- them. API tokens are read with it, so a replica can keep the catalogue in memory and know,
-- on every request, whether its copy is still current: a submission then costs one round
-- trip less, with no staleness at all.
create table catalogue_version (
    id      integer primary key constraint catalogue_version_one_row check (id = 1),
    version bigint not null
);
insert into catalogue_version (id, version) values (1, 0);

create function bump_catalogue_version() returns trigger language plpgsql as $$
begin
    update catalogue_version set version = version + 1 where id = 1;
    return null;
end
$$;

create trigger priority_classes_catalogue after insert or update or delete or truncate on priority_classes
    for each statement execute function bump_catalogue_version();
create trigger gpu_classes_catalogue after insert or update or delete or truncate on gpu_classes
    for each statement execute function bump_catalogue_version();
create trigger cluster_capacity_catalogue after insert or update or delete or truncate on cluster_capacity
    for each statement execute function bump_catalogue_version();
create trigger teams_catalogue after update of max_runtime_seconds or delete on teams
    for each statement execute function bump_catalogue_version();
