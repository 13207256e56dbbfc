//! Migrations are reversible.

use fairway::db::MIGRATOR;

#[tokio::test]
async fn every_migration_reverts_to_an_empty_schema_and_reapplies() {
    let pool = fairway_tests::fresh_database().await;
    let tables = |pool: sqlx::PgPool| async move {
        let n: i64 = sqlx::query_scalar("select count(*) from information_schema.tables where table_schema = 'public' and table_name <> '_sqlx_migrations'")
            .fetch_one(&pool)
            .await
            .unwrap();
        n
    };
    assert!(tables(pool.clone()).await > 10);
    MIGRATOR.undo(&pool, 0).await.unwrap();
    assert_eq!(tables(pool.clone()).await, 0, "down leaves nothing behind");
    MIGRATOR.run(&pool).await.unwrap();
    assert!(tables(pool.clone()).await > 10);
}

#[tokio::test]
async fn migrate_down_without_a_target_reverts_only_the_newest_migration() {
    let pool = fairway_tests::fresh_database().await;
    let applied = fairway::db::schema::applied_versions(&pool).await.unwrap();
    let at = fairway::db::schema::migrate_down(&pool, None).await.unwrap();
    assert_eq!(at, Some(applied[1]));
    let now = fairway::db::schema::applied_versions(&pool).await.unwrap();
    assert_eq!(now, applied[1..].to_vec(), "exactly the newest migration was reverted");
}

#[tokio::test]
async fn migrate_down_refuses_with_a_clear_message_when_the_applied_versions_cannot_be_read() {
    let pool = fairway_tests::fresh_database().await;
    let tables_before = public_tables(&pool).await;
    // The ledger of applied migrations becomes unreadable (as when the read fails or the
    // role lacks the right): guessing a target would risk reverting everything.
    sqlx::query("alter table _sqlx_migrations rename to _sqlx_migrations_hidden").execute(&pool).await.unwrap();
    let err = fairway::db::schema::migrate_down(&pool, None).await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains("cannot read the applied migrations"), "{message}");
    assert!(message.contains("refusing to revert anything"), "{message}");
    assert!(message.contains("--target"), "{message}");
    sqlx::query("alter table _sqlx_migrations_hidden rename to _sqlx_migrations").execute(&pool).await.unwrap();
    assert_eq!(public_tables(&pool).await, tables_before, "nothing was reverted");
}

async fn public_tables(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from information_schema.tables where table_schema = 'public'")
        .fetch_one(pool)
        .await
        .unwrap()
}
