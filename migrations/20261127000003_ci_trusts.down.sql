alter table api_tokens drop column ci_trust_id;
drop table ci_trusts;
