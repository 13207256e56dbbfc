drop table replica_utilisation;
