drop table webhook_cursor;
drop table webhook_deliveries;
drop table webhooks;
