drop table oidc_sign_ins;
alter table web_sessions drop column provider, drop column id_token;
alter table team_members drop column source;
drop table user_identities;
