//! A real failover manager: Patroni with etcd and `synchronous_mode: true`, two
//! PostgreSQL nodes (tests/src/patroni.rs). The leader crashes under load, Patroni
//! promotes its synchronous standby, and the crashed node's Patroni, started again,
//! rewinds it and rejoins as the new standby. The binaries only know the multi-host URL
//! and are never restarted. The same invariants as failover.rs: nothing answered 201 is
//! lost, no event for a commit the new leader lacks, every event of the new leader
//! published; and with `--wait-for-standbys sync`, events flow on the new leader before
//! the old one rejoins. Slow (Patroni's 20 s minimum leader TTL): `make chaos` only.

use std::time::Instant;

use charges_tests::failover::{
    assert_acknowledged_kept, assert_topic_matches_outbox, client_charges, wait_until_all_published,
};
use charges_tests::kafka::TestKafka;
use charges_tests::patroni::PatroniCluster;
use charges_tests::{TestApi, TestDb, connect, poll_until, start_relay};

#[tokio::test]
#[ignore = "slow: make chaos (needs make ha-deps)"]
async fn slow_patroni_promotes_the_sync_standby_under_load_and_loses_nothing_acknowledged() {
    let mut cluster = PatroniCluster::start().await;
    let old_leader = cluster.leader(None).await;
    let db = TestDb::new_on(&cluster.url("postgres")).await;
    let kafka = TestKafka::new(3).await;
    let api = TestApi::start(&db, &[]).await;
    // `sync`: whichever node Patroni names in synchronous_standby_names, and nothing to
    // wait for while it names none (the new leader before the old one rejoins).
    let gate = ["--wait-for-standbys", "sync"];
    let (mut relay_1, _) = start_relay(&db, &kafka, &gate).await;
    let (mut relay_2, _) = start_relay(&db, &kafka, &gate).await;

    let failover = async {
        db.wait_for(
            "SELECT count(*) >= 40 FROM charges",
            &[],
            "the load is under way",
        )
        .await;
        let crashed = Instant::now();
        cluster.crash(&old_leader);
        let new_leader = cluster.leader(Some(&old_leader)).await;
        let promoted = crashed.elapsed();
        // Alone, the new leader names no synchronous standby: events keep flowing
        // before the old leader rejoins.
        let on_new_leader = connect(&cluster.url_on(&new_leader, &db)).await;
        let since: chrono::DateTime<chrono::Utc> = on_new_leader
            .query_one("SELECT now()", &[])
            .await
            .expect("the new leader's clock")
            .get(0);
        poll_until(
            "an event published on the new leader, old leader down",
            async || {
                let published: i64 = on_new_leader
                    .query_one(
                        "SELECT count(*) FROM outbox WHERE published_at > $1",
                        &[&since],
                    )
                    .await
                    .ok()?
                    .get(0);
                (published > 0).then_some(())
            },
        )
        .await;
        cluster.restart(&old_leader);
        cluster.wait_for_role(&old_leader, "sync_standby").await;
        (new_leader, promoted, crashed.elapsed())
    };
    let (acknowledged, (new_leader, promoted, rejoined)) = tokio::join!(
        futures::future::join_all((0..8).map(|_| client_charges(&api, 40))),
        failover
    );
    let acknowledged: Vec<String> = acknowledged.concat();
    let new_leader_url = cluster.url_on(&new_leader, &db);
    assert_acknowledged_kept(&new_leader_url, &acknowledged).await;
    wait_until_all_published(&new_leader_url).await;
    relay_1.stop().await;
    relay_2.stop().await;
    let published = assert_topic_matches_outbox(&new_leader_url, &kafka).await;
    println!(
        "CHAOS patroni failover: {} charges acknowledged, {published} events published, none lost; \
         {new_leader} leader {:.1} s after the crash of {old_leader}, \
         which rejoined as its synchronous standby after {:.1} s",
        acknowledged.len(),
        promoted.as_secs_f64(),
        rejoined.as_secs_f64()
    );
}
