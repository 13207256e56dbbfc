-- Submissions are now refused when they can never run under the team's quotas (larger than
-- reserved + burst at some level of the team tree, or a non-preemptible job larger than the
-- team's reserved quota), so quotas and the shape of the tree join what the catalogue
-- version covers: a replica's cached catalogue is then never older than a quota change.
create trigger quotas_catalogue after insert or update or delete or truncate on quotas
    for each statement execute function bump_catalogue_version();
create trigger teams_parent_catalogue after update of parent_id on teams
    for each statement execute function bump_catalogue_version();
