-- Single sign-on. People who sign in through an OpenID provider are linked to a Fairway user
-- by the provider's subject, never by a name that happens to match.
create table user_identities (
    provider     text not null,
    subject      text not null,
    user_id      uuid not null constraint user_identities_user_id_fkey references users (id) on delete cascade,
    created_at   timestamptz not null default now(),
    last_sign_in timestamptz not null default now(),
    constraint user_identities_pkey primary key (provider, subject)
);
create index user_identities_user_id_idx on user_identities (user_id);

-- Where a membership came from: null when an admin made it, `oidc:{provider}` when a
-- provider's groups grant it (and may take it away at the next sign-in).
alter table team_members add column source text;

-- A session begun through a provider keeps what RP-initiated logout needs.
alter table web_sessions add column provider text, add column id_token text;

-- Sign-ins under way: the state's hash, and the nonce and PKCE verifier the callback needs.
-- Each is taken once (a replayed callback finds nothing) and lives ten minutes.
create table oidc_sign_ins (
    state_hash bytea primary key,
    provider   text not null,
    nonce      text not null,
    verifier   text not null,
    expires_at timestamptz not null
);
create index oidc_sign_ins_expires_idx on oidc_sign_ins (expires_at);
