-- What a submission authorised from a cached API token must still find true when it is
-- written (see `db::jobs::WriteCheck`): the token live and of this team, the team unchanged,
-- the catalogue at the version the job was validated against. A PL/pgSQL function, not an
-- inline condition: the planner does not look inside it, and planning the submission
-- statement with the condition inline cost more than a round trip.
create function submission_check_holds(token uuid, team uuid, team_version bigint, catalogue bigint)
    returns boolean language plpgsql stable as $$
begin
    return catalogue = (select v.version from catalogue_version v where v.id = 1)
       and exists (select 1 from api_tokens t join teams tm on tm.id = t.team_id
                   where t.id = token and t.team_id = team and t.revoked_at is null
                     and t.expires_at > now() and tm.version = team_version);
end
$$;
