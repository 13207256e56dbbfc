-- Trust policies for CI: a team trusts the ID tokens a CI issuer (GitHub Actions, GitLab CI,
-- Buildkite) gives its jobs, when the token's claims match the policy's conditions, and a
-- pipeline exchanges such a token for a short-lived API token of the team. No long-lived
-- secret has to live in the CI system.
create table ci_trusts (
    id                uuid primary key,
    team_id           uuid not null constraint ci_trusts_team_id_fkey references teams (id) on delete cascade,
    -- Lowercase letters, digits, '-', '_' and '.'; the exchanged tokens are named `ci:<name>`.
    name              text not null,
    -- One of the configured CI issuers, exactly as its tokens' `iss` says.
    issuer            text not null,
    -- The `aud` the tokens must carry (what the pipeline asks its CI system for).
    audience          text not null,
    -- Claim name → pattern (exact, `*` for any run of characters), all of which must match.
    -- Never empty: a policy on the issuer and audience alone would admit every repository
    -- of the CI system.
    conditions        jsonb not null constraint ci_trusts_conditions_check
                      check (jsonb_typeof(conditions) = 'object' and conditions <> '{}'::jsonb),
    role              text not null constraint ci_trusts_role_check check (role in ('admin', 'member', 'viewer')),
    token_ttl_seconds integer not null default 900 constraint ci_trusts_token_ttl_seconds_check
                      check (token_ttl_seconds between 60 and 3600),
    created_by        text not null,
    created_at        timestamptz not null default now(),
    constraint ci_trusts_team_id_name_key unique (team_id, name)
);
-- An exchange reads the policies of the token's issuer.
create index ci_trusts_issuer_idx on ci_trusts (issuer);

-- The trust policy an API token was exchanged under: deleting the policy revokes them.
alter table api_tokens add column ci_trust_id uuid
    constraint api_tokens_ci_trust_id_fkey references ci_trusts (id) on delete set null;
create index api_tokens_ci_trust_id_idx on api_tokens (ci_trust_id) where ci_trust_id is not null;
