alter table jobs reset (fillfactor);
