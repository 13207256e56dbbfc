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
