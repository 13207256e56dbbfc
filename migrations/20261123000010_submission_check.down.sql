drop function submission_check_holds(uuid, uuid, bigint, bigint);
