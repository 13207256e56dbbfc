//! Behaviour of one cycle on small, hand-made clusters.

use std::collections::BTreeMap;

use super::*;

const HOUR: i64 = 3_600_000;
const NOW: i64 = 100 * HOUR;

/// Priority classes: 0 = production (not preemptible), 1 = experiment, 2 = scavenger.
fn priorities() -> Vec<PriorityClass> {
    let p = |name: &str, priority, preemptible| PriorityClass {
        name: name.into(),
        priority,
        preemptible,
        price_multiplier_milli: 1000,
        usage_factor_milli: 1000,
        preemption_grace_ms: 30_000,
        preemption_delay_ms: 0,
    };
    vec![p("production", 500, false), p("experiment", 100, true), p("scavenger", 0, true)]
}

fn team(name: &str, reserved_gpus: u64, burst_gpus: u64) -> Team {
    let mut quotas = BTreeMap::new();
    quotas
        .insert(0, Quota { reserved: reserved_gpus * 1000, burst: burst_gpus * 1000, lendable: reserved_gpus * 1000 });
    Team {
        name: name.into(),
        parent: None,
        quotas,
        fair_share_weight_milli: 1000,
        usage_history_micros: 0.0,
        hard_budget_left_micros: None,
        soft_budget_left_micros: None,
        hard_budget_left_gpu_milli_ms: None,
    }
}

/// `nodes` nodes of 8 GPUs of one class in one rack, and teams `a` and `b`.
fn cluster(nodes: usize, teams: Vec<Team>) -> Snapshot {
    Snapshot {
        now_ms: NOW,
        classes: vec![GpuClass { name: "h100".into(), rate_micros_per_hour: 2_000_000, fraction_milli: 1000 }],
        nodes: (0..nodes)
            .map(|i| Node {
                name: format!("n{i}"),
                class: 0,
                units: 8,
                nvlink_domain_size: 8,
                rack: Some(0),
                zone: Some(0),
                elastic: false,
                spot: false,
                drivers: Default::default(),
                host: None,
                cluster: 0,
            })
            .collect(),
        teams,
        priorities: priorities(),
        running: Vec::new(),
        pending: Vec::new(),
        history: Default::default(),
        forecast_errors: Default::default(),
        config: Config::default(),
    }
}

fn job(id: JobId, team: TeamId, gpus: u32, priority: PriorityId) -> JobSpec {
    JobSpec {
        id,
        team,
        class: 0,
        replicas: 1,
        milli_per_replica: gpus * 1000,
        priority,
        topology: Topology::Any,
        submitted_ms: NOW - HOUR + id as i64,
        queued_ms: NOW - HOUR + id as i64,
        max_runtime_ms: 4 * HOUR,
        allow_spot: false,
        fixed_nodes_only: false,
        kind: None,
        expected_runtime_ms: None,
        grace_ms: None,
        min_drivers: Default::default(),
        host: Default::default(),
        preemption_delay_ms: None,
        attained_ms: 0,
        elastic: None,
    }
}

/// Runs `job` as if admitted `age_ms` ago, at a placement found on the snapshot.
fn start(s: &mut Snapshot, spec: JobSpec, age_ms: i64) {
    let mut inv = inventory::Inventory::new(&s.nodes, s.classes.len());
    for r in &s.running {
        inv.allocate(&r.placement);
    }
    let placement = inv.find(&spec).expect("the test cluster has room");
    s.running.push(RunningJob {
        spec,
        started_ms: s.now_ms - age_ms,
        last_checkpoint_ms: None,
        placement,
        terminating: false,
    });
}

fn reason_of(d: &Decisions, id: JobId) -> PendingReason {
    d.pending.iter().find(|p| p.job == id).map(|p| p.reason.clone()).expect("pending")
}

fn admitted(d: &Decisions) -> Vec<JobId> {
    d.admissions.iter().map(|a| a.job).collect()
}

#[test]
fn reserved_demand_goes_before_earlier_burst_demand() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 4, 4)]);
    // b already uses its reserved 4; its next job would borrow. a's job is within reserved.
    start(&mut s, job(1, 1, 4, 1), HOUR);
    s.pending = vec![job(2, 1, 4, 1), job(3, 0, 4, 1)];
    s.pending[0].submitted_ms = NOW - 2 * HOUR;
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![3]);
    assert!(!d.admissions[0].borrowing);
    assert!(matches!(reason_of(&d, 2), PendingReason::InsufficientCapacity | PendingReason::FairShareBehind { .. }));
}

#[test]
fn a_team_reclaims_its_reserved_quota_from_a_borrower_in_one_round() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 4, 4)]);
    // b borrows all of a's idle quota: 8 GPUs, 4 of them borrowed.
    start(&mut s, job(1, 1, 4, 1), HOUR);
    start(&mut s, job(2, 1, 2, 1), HOUR);
    start(&mut s, job(3, 1, 2, 1), 2 * HOUR);
    s.pending = vec![job(10, 0, 4, 0)];
    let d = schedule(&s);
    assert!(d.admissions.is_empty());
    assert_eq!(reason_of(&d, 10), PendingReason::WaitingForReclaim);
    let mut victims: Vec<JobId> = d.preemptions.iter().map(|p| p.victim).collect();
    victims.sort();
    // Cheapest first, without taking b below its reserved quota: jobs 2 and 3, not job 1.
    assert_eq!(victims, vec![2, 3]);
    assert!(d
        .preemptions
        .iter()
        .all(|p| p.reason == PreemptReason::Reclaim && p.for_job == 10 && p.grace_ms == 30_000));
    // Next cycle, after the victims are gone: admitted.
    s.running.retain(|r| !victims.contains(&r.spec.id));
    let d2 = schedule(&s);
    assert_eq!(admitted(&d2), vec![10]);
    assert!(d2.preemptions.is_empty());
}

#[test]
fn victims_are_the_jobs_that_lose_the_least_work() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 0, 8)]);
    start(&mut s, job(1, 1, 4, 1), 10 * HOUR);
    start(&mut s, job(2, 1, 4, 1), HOUR);
    s.running[0].last_checkpoint_ms = Some(NOW - 60_000);
    s.pending = vec![job(10, 0, 4, 0)];
    let d = schedule(&s);
    assert_eq!(d.preemptions.len(), 1);
    assert_eq!(d.preemptions[0].victim, 1, "checkpointed a minute ago: least work lost");
    assert_eq!(d.preemptions[0].lost_work, 4 * 60_000);
}

#[test]
fn jobs_younger_than_the_minimum_runtime_are_not_preempted() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 0, 8)]);
    start(&mut s, job(1, 1, 8, 1), 60_000);
    s.pending = vec![job(10, 0, 4, 0)];
    let d = schedule(&s);
    assert!(d.preemptions.is_empty());
    // It says what it waits for: the borrower's minimum runtime, over in 4 minutes.
    assert_eq!(reason_of(&d, 10), PendingReason::VictimsInMinimumRuntime { at_ms: NOW + 4 * 60_000 });
}

#[test]
fn non_preemptible_jobs_never_borrow() {
    let mut s = cluster(1, vec![team("a", 2, 6)]);
    start(&mut s, job(1, 0, 2, 0), HOUR);
    s.pending = vec![job(2, 0, 2, 0), job(3, 0, 4, 1), job(4, 0, 4, 0)];
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![3], "the preemptible job borrows");
    assert_eq!(reason_of(&d, 2), PendingReason::ReservedQuotaExhausted { team: 0 });
    assert_eq!(reason_of(&d, 4), PendingReason::ExceedsQuota { team: 0 }, "larger than all of a's reserved");
}

#[test]
fn a_production_job_runs_on_free_gpus_beside_its_teams_experiments_instead_of_preempting_them() {
    // a's experiments fill its reserved 8; 8 GPUs are free and a may borrow 8.
    let mut s = cluster(2, vec![team("a", 8, 8)]);
    start(&mut s, job(1, 0, 4, 1), HOUR);
    start(&mut s, job(2, 0, 4, 1), HOUR);
    s.pending = vec![job(3, 0, 4, 0)];
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![3]);
    assert!(d.preemptions.is_empty(), "no experiment stops for GPUs that are free: {:?}", d.preemptions);
    // The team now holds 12 of its reserved 8: the job is billed as burst.
    assert!(d.admissions[0].borrowing);
}

#[test]
fn a_production_job_in_a_full_cluster_stops_only_as_many_of_its_teams_experiments_as_it_needs_gpus() {
    // a (reserved 4, burst 4) runs three 2-GPU experiments, one of them borrowed; 2 GPUs are
    // free. Its 4-GPU production job needs 2 more GPUs and 2 more of quota: one experiment.
    let mut s = cluster(1, vec![team("a", 4, 4)]);
    for id in 1..=3 {
        start(&mut s, job(id, 0, 2, 1), HOUR);
    }
    s.pending = vec![job(4, 0, 4, 0)];
    let d = schedule(&s);
    let victims: Vec<(JobId, PreemptReason)> = d.preemptions.iter().map(|p| (p.victim, p.reason)).collect();
    assert_eq!(victims.len(), 1, "one experiment makes room, not all three: {victims:?}");
    assert_eq!(victims[0].1, PreemptReason::Priority);
    assert_eq!(reason_of(&d, 4), PendingReason::WaitingForReclaim);
}

#[test]
fn a_production_job_past_its_teams_reserved_quota_leaves_free_gpus_to_another_teams_reserved_demand() {
    // a's young experiment fills a's reserved 4; 4 GPUs are free. a's production job came
    // first and outranks everything, but on the free GPUs it would borrow, and b, which asks
    // within its reserved 4, could not take them back from a's experiment in its minimum
    // runtime.
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 4, 4)]);
    start(&mut s, job(1, 0, 4, 1), 60_000);
    s.pending = vec![job(10, 0, 4, 0), job(20, 1, 4, 1)];
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![20], "b's reserved demand runs now: {:?}", d.pending);
    assert!(d.preemptions.is_empty());
    // a's own experiment makes room for it once it may be preempted.
    assert_eq!(reason_of(&d, 10), PendingReason::VictimsInMinimumRuntime { at_ms: NOW + 4 * 60_000 });
}

#[test]
fn reclaim_takes_what_a_production_job_took_its_team_past_reserved_from_the_teams_experiments() {
    // a runs two 8-GPU experiments, one in its reserved 8, and an 8-GPU production job beside
    // them, on GPUs b lends; b wants 8 of its reserved 16 back.
    let mut s = cluster(3, vec![team("a", 8, 16), team("b", 16, 0)]);
    start(&mut s, job(1, 0, 8, 1), HOUR);
    start(&mut s, job(2, 0, 8, 1), 2 * HOUR);
    start(&mut s, job(3, 0, 8, 0), HOUR);
    s.pending = vec![job(10, 1, 8, 1)];
    let d = schedule(&s);
    let victims: Vec<(JobId, PreemptReason)> = d.preemptions.iter().map(|p| (p.victim, p.reason)).collect();
    assert_eq!(victims, vec![(1, PreemptReason::Reclaim)], "one experiment, the one that ran least");
}

#[test]
fn a_team_never_exceeds_reserved_plus_burst_nor_its_ancestors_limits() {
    let mut s = cluster(2, vec![team("dept", 4, 0), team("a", 2, 8)]);
    s.teams[1].parent = Some(0);
    s.pending = vec![job(1, 1, 4, 1), job(2, 1, 2, 1)];
    let d = schedule(&s);
    // Job 2 fits a's reserved quota and goes first; job 1 would borrow, and the department
    // is a closed pool of 4.
    assert_eq!(admitted(&d), vec![2]);
    assert_eq!(reason_of(&d, 1), PendingReason::BurstLimit { team: 0 });
}

#[test]
fn a_hard_budget_blocks_a_job_it_cannot_pay_for_and_a_soft_one_only_flags() {
    let mut s = cluster(1, vec![team("a", 8, 0), team("b", 0, 8)]);
    // 4 GPUs × $2 × 4 h = $32 maximum cost.
    s.teams[0].hard_budget_left_micros = Some(31_000_000);
    s.teams[1].soft_budget_left_micros = Some(1_000_000);
    s.pending = vec![job(1, 0, 4, 1), job(2, 1, 4, 1)];
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 1), PendingReason::BudgetExhausted);
    assert_eq!(admitted(&d), vec![2]);
    assert_eq!(d.admissions[0].max_cost_micros, 32_000_000);
    assert!(d.admissions[0].exceeds_soft_budget);
}

#[test]
fn budgets_pay_only_for_what_runs_before_their_period_ends() {
    // A service's replica running with no maximum runtime, and a job of 4 GPUs × $2 × 4 h.
    let mut s = cluster(1, vec![team("a", 8, 0)]);
    s.config.budget_period_end_ms = Some(NOW + HOUR);
    start(&mut s, JobSpec { max_runtime_ms: i64::from(i32::MAX) * 1000, ..job(9, 0, 2, 0) }, HOUR);
    // The replica commits one hour ($4), the new job one hour ($8): $12 fits, $11 does not.
    s.teams[0].hard_budget_left_micros = Some(12_000_000);
    s.teams[0].soft_budget_left_micros = Some(12_000_000);
    s.pending = vec![job(1, 0, 4, 1)];
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![1]);
    assert!(!d.admissions[0].exceeds_soft_budget, "the replica's years beyond the month are not this month's");
    s.teams[0].hard_budget_left_micros = Some(11_000_000);
    assert_eq!(reason_of(&schedule(&s), 1), PendingReason::BudgetExhausted);
    // Without a period the whole maximum counts, as before.
    s.config.budget_period_end_ms = None;
    s.teams[0].hard_budget_left_micros = Some(1_000_000_000);
    assert_eq!(reason_of(&schedule(&s), 1), PendingReason::BudgetExhausted);
}

#[test]
fn a_departments_hard_budget_is_shared_by_its_teams_not_given_to_each() {
    // A department with $40 left and two child teams that may use its pool.
    let mut department = team("dept", 8, 0);
    department.hard_budget_left_micros = Some(40_000_000);
    let mut a = team("a", 4, 0);
    a.parent = Some(0);
    let mut b = team("b", 4, 0);
    b.parent = Some(0);
    let mut s = cluster(1, vec![department, a, b]);
    // Each job: 4 GPUs × $2 × 4 h = $32. One fits the department's $40, two do not.
    s.pending = vec![job(1, 1, 4, 1), job(2, 2, 4, 1)];
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![1]);
    assert_eq!(reason_of(&d, 2), PendingReason::BudgetExhausted);
}

#[test]
fn a_gpu_hour_budget_blocks_a_job_whose_gpu_time_it_cannot_cover() {
    let mut s = cluster(1, vec![team("a", 8, 0)]);
    // 15 GPU-hours left; a 4-GPU job of 4 hours needs 16, a 3-GPU one 12.
    s.teams[0].hard_budget_left_gpu_milli_ms = Some(15 * 1000 * HOUR);
    s.pending = vec![job(1, 0, 4, 1), job(2, 0, 3, 1)];
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 1), PendingReason::BudgetExhausted);
    assert_eq!(admitted(&d), vec![2]);
}

#[test]
fn a_blocked_gang_gets_a_reservation_and_only_short_jobs_backfill() {
    let mut s = cluster(2, vec![team("a", 32, 0)]);
    start(&mut s, job(1, 0, 8, 0), HOUR); // production, ends in 3 h
    start(&mut s, job(2, 0, 4, 0), HOUR); // production, ends in 3 h
    let mut gang = job(10, 0, 8, 1);
    gang.replicas = 2;
    let mut long = job(11, 0, 2, 1);
    long.max_runtime_ms = 10 * HOUR;
    let mut short = job(12, 0, 2, 1);
    short.max_runtime_ms = HOUR;
    s.pending = vec![gang, long, short];
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 10), PendingReason::InsufficientCapacity);
    assert_eq!(reason_of(&d, 11), PendingReason::ReservedFor { job: 10 });
    assert_eq!(admitted(&d), vec![12], "ends before the gang's reservation");
    assert_eq!(d.admissions[0].backfilled_ahead_of, Some(10), "the admission names the gang it runs ahead of");
    // No history: the running jobs' 3 hours left are uniform, so the gang starts within them.
    let gang = pending_of(&d, 10);
    let (earliest, expected, latest) =
        (gang.earliest_start_ms.unwrap(), gang.expected_start_ms.unwrap(), gang.latest_start_ms.unwrap());
    assert!(NOW < earliest && earliest <= expected && expected <= latest && latest <= NOW + 3 * HOUR, "{gang:?}");
    // Played at p10, p50 and p90, they end in 0.3, 1.5 and 2.7 hours, and the gang starts then.
    s.config.start_time_model = StartTimeModel::QuantileForecast;
    let d = schedule(&s);
    let gang = pending_of(&d, 10);
    let interval = (gang.earliest_start_ms, gang.expected_start_ms, gang.latest_start_ms);
    assert_eq!(interval, (Some(NOW + 3 * HOUR / 10), Some(NOW + 3 * HOUR / 2), Some(NOW + 27 * HOUR / 10)));
    s.config.start_time_model = StartTimeModel::MaxRuntime;
    let d = schedule(&s);
    let gang_eta = d.pending.iter().find(|p| p.job == 10).and_then(|p| p.expected_start_ms);
    assert_eq!(gang_eta, Some(NOW + 3 * HOUR), "the naive model waits for the maximum runtimes");
}

#[test]
fn by_service_a_blocked_gang_holds_gpus_only_once_it_has_waited_past_the_starvation_bound() {
    let mut s = cluster(2, vec![team("a", 32, 0)]);
    start(&mut s, job(1, 0, 8, 0), HOUR); // production, ends in 3 h
    start(&mut s, job(2, 0, 4, 0), HOUR);
    s.pending = gang_and_a_ten_hour_job(2);
    s.config.queue_order = QueueOrder::SERVICE;
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 10), PendingReason::InsufficientCapacity);
    assert_eq!(admitted(&d), vec![11], "an hour in the queue, the gang holds nothing against a later job");
    s.pending[0].queued_ms = NOW - DEFAULT_STARVATION_MS;
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 11), PendingReason::ReservedFor { job: 10 }, "past the bound, it holds the free GPUs");
    assert!(admitted(&d).is_empty());
    s.pending[0].queued_ms = NOW - HOUR;
    s.config.queue_order = QueueOrder::Arrival;
    assert_eq!(reason_of(&schedule(&s), 11), PendingReason::ReservedFor { job: 10 }, "in arrival order, at once");
}

#[test]
fn by_service_expected_starts_give_a_blocked_gang_no_reservation_before_the_starvation_bound() {
    // Both nodes full: job 1 ends within the hour, job 2 within three. The 16-GPU gang waits
    // for both; a scavenger of 8 GPUs for up to 10 hours waits for either.
    let mut s = cluster(2, vec![team("a", 32, 0)]);
    start(&mut s, job(1, 0, 8, 0), 3 * HOUR);
    start(&mut s, job(2, 0, 8, 0), HOUR);
    s.pending = gang_and_a_ten_hour_job(8);
    let expected = |s: &Snapshot| {
        let d = schedule(s);
        (pending_of(&d, 10).expected_start_ms.unwrap(), pending_of(&d, 11).expected_start_ms.unwrap())
    };
    let (gang, long) = expected(&s);
    assert!(gang < long, "in arrival order the gang holds the first node freed: {gang} {long}");
    s.config.queue_order = QueueOrder::SERVICE;
    let (gang, long) = expected(&s);
    assert!(long < gang, "by service, an hour in the queue, it does not: {gang} {long}");
    s.pending[0].queued_ms = NOW - DEFAULT_STARVATION_MS;
    let (gang, long) = expected(&s);
    assert!(gang < long, "past the starvation bound it does: {gang} {long}");
}

/// Job 10, an experiment gang of two 8-GPU replicas, and job 11, a scavenger of `gpus` GPUs
/// for up to 10 hours, both of team 0 and class 0.
fn gang_and_a_ten_hour_job(gpus: u32) -> Vec<JobSpec> {
    let mut gang = job(10, 0, 8, 1);
    gang.replicas = 2;
    let mut long = job(11, 0, gpus, 2);
    long.max_runtime_ms = 10 * HOUR;
    vec![gang, long]
}

fn pending_of(d: &Decisions, id: JobId) -> &Pending {
    d.pending.iter().find(|p| p.job == id).expect("pending")
}

#[test]
fn a_job_at_its_teams_burst_limit_is_expected_when_its_teams_own_jobs_free_the_quota() {
    let mut s = cluster(1, vec![team("a", 4, 0), team("b", 0, 8)]);
    start(&mut s, job(1, 0, 4, 1), HOUR); // 3 hours left of 4
    s.pending = vec![job(2, 0, 4, 1)];
    s.config.start_time_model = StartTimeModel::QuantileForecast;
    let d = schedule(&s);
    let p = pending_of(&d, 2);
    assert_eq!(p.reason, PendingReason::BurstLimit { team: 0 });
    assert_eq!(p.unforeseeable, None);
    assert_eq!(p.expected_start_ms, Some(NOW + 3 * HOUR / 2));
}

#[test]
fn a_job_larger_than_its_quota_says_it_waits_for_a_quota_change() {
    let mut s = cluster(1, vec![team("a", 2, 0)]);
    s.pending = vec![job(1, 0, 4, 1)];
    let d = schedule(&s);
    let p = pending_of(&d, 1);
    assert_eq!(p.reason, PendingReason::ExceedsQuota { team: 0 });
    assert_eq!(p.unforeseeable, Some(Unforeseeable::QuotaChange { team: 0 }));
    assert_eq!((p.earliest_start_ms, p.expected_start_ms, p.latest_start_ms), (None, None, None));
    let name = |_| "a".to_owned();
    assert!(Unforeseeable::QuotaChange { team: 0 }.message(&name).contains("quota"));
}

#[test]
fn a_job_its_budget_cannot_cover_says_it_waits_for_a_budget_change() {
    let mut a = team("a", 8, 0);
    a.hard_budget_left_micros = Some(1);
    let mut s = cluster(1, vec![a]);
    s.pending = vec![job(1, 0, 4, 1)];
    let d = schedule(&s);
    assert_eq!(pending_of(&d, 1).unforeseeable, Some(Unforeseeable::BudgetChange));
}

#[test]
fn history_of_jobs_like_the_running_one_brings_the_expected_start_forward() {
    let mut s = cluster(1, vec![team("a", 8, 8)]);
    let mut running = job(1, 0, 8, 1);
    running.kind = Some(7);
    running.max_runtime_ms = 24 * HOUR;
    start(&mut s, running, HOUR / 6);
    let mut history = RuntimeHistory::default();
    for m in 50..70 {
        history.record(0, Some(7), m * 60_000);
    }
    s.history = std::sync::Arc::new(history);
    s.pending = vec![job(2, 0, 8, 1)];
    let d = schedule(&s);
    let p = pending_of(&d, 2);
    let (earliest, expected, latest) =
        (p.earliest_start_ms.unwrap(), p.expected_start_ms.unwrap(), p.latest_start_ms.unwrap());
    assert!(NOW < earliest && earliest <= expected && expected <= latest && latest <= NOW + HOUR, "{p:?}");
    s.config.start_time_model = StartTimeModel::MaxRuntime;
    let naive = schedule(&s);
    assert_eq!(pending_of(&naive, 2).expected_start_ms, Some(NOW + 24 * HOUR - HOUR / 6));
}

#[test]
fn a_dry_run_needing_victims_inside_their_minimum_runtime_is_expected_once_they_may_be_preempted() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 0, 8)]);
    start(&mut s, job(1, 1, 8, 1), 60_000); // b borrows all 8 GPUs, for a minute so far
    let answer = dry_run::dry_run(&s, &job(10, 0, 4, 0));
    assert!(answer.victims.is_empty(), "too young to preempt: {answer:?}");
    // Preemptible after 5 minutes, then 30 seconds of grace (unless it ends sooner).
    let at = NOW + 4 * 60_000 + 30_000;
    assert_eq!((answer.expected_start_ms, answer.latest_start_ms), (Some(at), Some(at)), "{answer:?}");
    assert!(answer.earliest_start_ms.is_some_and(|e| e <= at));
}

#[test]
fn a_job_admitted_now_is_expected_now() {
    let answer = dry_run::dry_run(&cluster(1, vec![team("a", 4, 4)]), &job(11, 0, 2, 0));
    assert!(answer.placement.is_some());
    assert_eq!(
        (answer.earliest_start_ms, answer.expected_start_ms, answer.latest_start_ms),
        (Some(NOW), Some(NOW), Some(NOW))
    );
}

#[test]
fn a_higher_priority_job_preempts_its_own_teams_lower_priority_work() {
    let mut s = cluster(1, vec![team("a", 8, 0)]);
    start(&mut s, job(1, 0, 8, 2), HOUR);
    s.pending = vec![job(2, 0, 8, 1)];
    let d = schedule(&s);
    assert_eq!(d.preemptions.len(), 1);
    assert_eq!(d.preemptions[0].reason, PreemptReason::Priority);
}

#[test]
fn burst_capacity_goes_to_the_team_with_less_history() {
    let mut s = cluster(1, vec![team("a", 0, 8), team("b", 0, 8)]);
    s.teams[0].usage_history_micros = 500_000_000.0;
    s.pending = vec![job(1, 0, 8, 1), job(2, 1, 8, 1)];
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![2]);
    assert_eq!(reason_of(&d, 1), PendingReason::FairShareBehind { team: 1 });
    assert_eq!(reason_of(&d, 1).code(), "fair_share");
}

#[test]
fn fair_share_preemption_evens_out_borrowing_and_then_stops() {
    let mut s = cluster(2, vec![team("a", 0, 16), team("b", 0, 16)]);
    for id in 1..=4 {
        start(&mut s, job(id, 1, 4, 1), HOUR);
    }
    s.pending = (10..14).map(|id| job(id, 0, 4, 1)).collect();
    let mut preempted = 0;
    for _ in 0..10 {
        let d = schedule(&s);
        if d.preemptions.is_empty() && d.admissions.is_empty() {
            break;
        }
        preempted += d.preemptions.len();
        let gone: Vec<JobId> = d.preemptions.iter().map(|p| p.victim).collect();
        let requeued: Vec<JobSpec> =
            s.running.iter().filter(|r| gone.contains(&r.spec.id)).map(|r| r.spec.clone()).collect();
        s.running.retain(|r| !gone.contains(&r.spec.id));
        for a in &d.admissions {
            let spec = s.pending.iter().find(|j| j.id == a.job).cloned().expect("pending");
            s.running.push(RunningJob {
                spec,
                started_ms: s.now_ms - HOUR,
                last_checkpoint_ms: None,
                placement: a.placement.clone(),
                terminating: false,
            });
        }
        s.pending.retain(|j| !d.admissions.iter().any(|a| a.job == j.id));
        s.pending.extend(requeued);
    }
    let held = |t: TeamId| s.running.iter().filter(|r| r.spec.team == t).map(|r| r.spec.total_milli()).sum::<u64>();
    assert_eq!((held(0), held(1)), (8000, 8000), "after {preempted} preemptions the teams share evenly");
    let d = schedule(&s);
    assert!(d.preemptions.is_empty(), "no loop");
}

#[test]
fn strict_fifo_blocks_everything_behind_a_head_that_does_not_fit() {
    let mut s = cluster(1, vec![team("a", 0, 0)]);
    s.config.policy = Policy::Fifo;
    start(&mut s, job(1, 0, 6, 0), HOUR);
    s.pending = vec![job(2, 0, 4, 0), job(3, 0, 1, 0)];
    let d = schedule(&s);
    assert!(d.admissions.is_empty());
    assert_eq!(reason_of(&d, 3), PendingReason::BehindHeadOfLine { job: 2 });
}

#[test]
fn the_same_snapshot_gives_the_same_decisions() {
    let mut s = cluster(3, vec![team("a", 8, 8), team("b", 4, 12), team("c", 0, 24)]);
    for id in 0..40 {
        s.pending.push(job(id, (id % 3) as TeamId, 1 + (id % 4) as u32, (id % 3) as PriorityId));
    }
    assert_eq!(schedule(&s), schedule(&s));
}

#[test]
fn a_job_larger_than_any_node_never_fits() {
    let mut s = cluster(2, vec![team("a", 16, 0)]);
    s.pending = vec![job(1, 0, 9, 0)];
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 1), PendingReason::NeverFits);
    assert_eq!(d.pending[0].expected_start_ms, None);
}

/// Node `n0` runs driver 550.90.07 (CUDA 12.4), `n1` 560.35.03 (CUDA 12.6).
fn mid_upgrade(teams: Vec<Team>) -> Snapshot {
    let mut s = cluster(2, teams);
    s.nodes[0].drivers = DriverStack::read(Some("550.90.07"), Some("12.4"));
    s.nodes[1].drivers = DriverStack::read(Some("560.35.03"), Some("12.6"));
    s
}

fn requiring(spec: JobSpec, driver: Option<&str>, cuda: Option<&str>) -> JobSpec {
    JobSpec { min_drivers: DriverStack::read(driver, cuda), ..spec }
}

#[test]
fn a_job_that_requires_a_newer_driver_is_placed_only_on_nodes_that_run_it() {
    let mut s = mid_upgrade(vec![team("a", 16, 0)]);
    // Best fit would take the fuller node 0 for each; the requirement sends them to node 1.
    start(&mut s, job(9, 0, 2, 0), HOUR);
    assert_eq!(s.running[0].placement[0].node, 0, "best fit");
    s.pending = vec![requiring(job(1, 0, 4, 0), Some("560"), None), requiring(job(2, 0, 2, 0), None, Some("12.6"))];
    let d = schedule(&s);
    assert_eq!(admitted(&d), [1, 2]);
    assert!(d.admissions.iter().all(|a| a.placement.iter().all(|r| r.node == 1)), "{:?}", d.admissions);
    // A job that requires an older driver than both runs anywhere: best fit, node 0.
    s.pending = vec![requiring(job(3, 0, 2, 0), Some("535.104.05"), Some("12.2"))];
    assert_eq!(schedule(&s).admissions[0].placement[0].node, 0);
}

#[test]
fn a_job_whose_driver_nodes_are_busy_waits_saying_how_many_gpus_run_that_driver() {
    let mut s = mid_upgrade(vec![team("a", 16, 0)]);
    start(&mut s, requiring(job(9, 0, 6, 0), Some("560"), None), HOUR);
    s.pending = vec![requiring(job(1, 0, 4, 0), Some("560.35"), None)];
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 1), PendingReason::NoDriverFit);
    let figures = d.pending[0].figures;
    assert_eq!(figures.free, 10_000, "10 GPUs free in all");
    let drivers = figures.drivers.expect("driver figures");
    assert_eq!(drivers.free_meeting, 2_000, "2 of them on the node with the driver");
    assert_eq!(drivers.newest.driver.map(|v| v.to_string()).as_deref(), Some("560.35.03"));
    assert!(d.pending[0].expected_start_ms.is_some(), "it waits for capacity, which a forecast can place");
}

#[test]
fn a_job_that_requires_a_driver_no_node_runs_waits_for_an_upgrade_with_no_forecast() {
    let mut s = mid_upgrade(vec![team("a", 16, 0)]);
    s.pending = vec![requiring(job(1, 0, 1, 0), None, Some("12.8")), requiring(job(2, 0, 8, 0), Some("560"), None)];
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 1), PendingReason::DriverUnavailable);
    let p = d.pending.iter().find(|p| p.job == 1).unwrap();
    assert_eq!(p.unforeseeable, Some(decision::Unforeseeable::DriverChange));
    assert_eq!(p.expected_start_ms, None);
    assert_eq!(p.figures.drivers.unwrap().newest.cuda.map(|v| v.to_string()).as_deref(), Some("12.6"));
    assert_eq!(admitted(&d), [2], "8 GPUs on the one node that runs 560 hold the other");
    // Nodes whose cluster does not say which driver they run hold no job that requires one.
    let mut unknown = cluster(2, vec![team("a", 16, 0)]);
    unknown.pending = vec![requiring(job(1, 0, 1, 0), Some("1"), None), job(2, 0, 1, 0)];
    let d = schedule(&unknown);
    assert_eq!(reason_of(&d, 1), PendingReason::DriverUnavailable);
    assert_eq!(admitted(&d), [2]);
}

#[test]
fn a_dry_run_answers_like_a_real_submission_without_changing_anything() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 0, 8)]);
    start(&mut s, job(1, 1, 8, 1), HOUR);
    let before = s.clone();
    let answer = dry_run::dry_run(&s, &job(10, 0, 4, 0));
    assert_eq!(answer.placement, None);
    assert_eq!(answer.reason.map(|r| r.0), Some(PendingReason::WaitingForReclaim));
    assert_eq!(answer.victims.len(), 1);
    assert_eq!(answer.victims[0].victim, 1);
    assert_eq!(answer.max_cost_micros, 4 * 2_000_000 * 4);
    assert_eq!(answer.expected_start_ms, Some(NOW + 30_000), "when the victim's grace period ends");
    assert_eq!(s.running.len(), before.running.len());
    let free = dry_run::dry_run(&cluster(1, vec![team("a", 4, 4)]), &job(11, 0, 2, 0));
    assert!(free.placement.is_some());
    assert_eq!(free.expected_start_ms, Some(NOW));
}

#[test]
fn free_gpus_no_waiting_shape_can_use_are_reported_as_stranded() {
    let mut s = cluster(2, vec![team("a", 16, 0)]);
    start(&mut s, job(1, 0, 6, 0), HOUR); // leaves 2 GPUs on one node
    start(&mut s, job(2, 0, 5, 0), HOUR); // leaves 3 on the other
    s.pending = vec![job(3, 0, 4, 0)];
    let d = schedule(&s);
    assert_eq!(d.fragmentation.len(), 1);
    assert_eq!(d.fragmentation[0].free_milli, 5000);
    assert_eq!(d.fragmentation[0].stranded_milli, 5000, "5 GPUs free, but no node has the 4 the job needs");
    s.pending = vec![job(4, 0, 3, 0), job(5, 0, 4, 0)];
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![4]);
    assert_eq!(d.fragmentation[0].stranded_milli, 2000, "the 3-GPU job took 3; the 2 left fit no waiting job");
}

#[test]
fn a_job_waiting_on_its_teams_quota_carries_what_it_needs_what_the_team_holds_and_its_quota() {
    let mut s = cluster(2, vec![team("a", 4, 2)]);
    start(&mut s, job(1, 0, 5, 1), HOUR);
    s.pending = vec![job(2, 0, 3, 1)];
    let d = schedule(&s);
    let waiting = &d.pending[0];
    assert_eq!(waiting.reason, PendingReason::BurstLimit { team: 0 });
    let quota = Quota { reserved: 4000, burst: 2000, lendable: 4000 };
    assert_eq!(waiting.figures.quota, Some((quota, 5000)), "the quota, and the 5 GPUs the team holds");
    assert_eq!((waiting.figures.needs, waiting.figures.free), (3000, 11_000));
    assert_eq!(waiting.figures.budget, None);
}

#[test]
fn a_job_its_hard_budget_cannot_cover_names_the_budget_and_both_amounts() {
    let mut s = cluster(1, vec![team("a", 8, 0)]);
    // 2 GPUs × 2.00 an hour × 4 hours: 16.00, and 10.00 is left.
    s.teams[0].hard_budget_left_micros = Some(10_000_000);
    s.pending = vec![job(1, 0, 2, 1)];
    let d = schedule(&s);
    assert_eq!(d.pending[0].reason, PendingReason::BudgetExhausted);
    let shortfall = d.pending[0].figures.budget.expect("a shortfall");
    assert_eq!(
        (shortfall.team, shortfall.gpu_time, shortfall.needs, shortfall.left),
        (0, false, 16_000_000, 10_000_000)
    );
}

#[test]
fn every_reason_has_its_own_code_from_the_fixed_list() {
    let reasons = [
        PendingReason::NeverFits,
        PendingReason::BurstLimit { team: 0 },
        PendingReason::ExceedsQuota { team: 0 },
        PendingReason::ReservedQuotaExhausted { team: 0 },
        PendingReason::BudgetExhausted,
        PendingReason::NoTopologyFit { within: None },
        PendingReason::FairShareBehind { team: 0 },
        PendingReason::InsufficientCapacity,
        PendingReason::WaitingForReclaim,
        PendingReason::ReservedFor { job: 1 },
        PendingReason::BehindHeadOfLine { job: 1 },
        PendingReason::VictimsInMinimumRuntime { at_ms: NOW },
        PendingReason::DriverUnavailable,
        PendingReason::NoDriverFit,
        PendingReason::NoHostFit { asks: Host::default() },
        PendingReason::PreemptionDelayed { until_ms: NOW, victims: 1 },
    ];
    let codes: Vec<&str> = reasons.iter().map(PendingReason::code).collect();
    assert_eq!(codes, PendingReason::CODES);
}

#[test]
fn a_sub_team_that_lends_nothing_keeps_its_reserved_quota_from_teams_outside_its_department() {
    // Department d lends all its reserved quota, but its sub-team strict lends none of its 4.
    let mut dept = team("d", 8, 0);
    dept.quotas.insert(0, Quota { reserved: 8000, burst: 0, lendable: 8000 });
    let mut strict = team("strict", 4, 0);
    strict.parent = Some(0);
    strict.quotas.insert(0, Quota { reserved: 4000, burst: 0, lendable: 0 });
    let mut open = team("open", 4, 0);
    open.parent = Some(0);
    let mut s = cluster(1, vec![dept, strict, open, team("outsider", 0, 8)]);
    s.pending = vec![job(1, 3, 6, 1)];
    let d = schedule(&s);
    assert_eq!(admitted(&d), Vec::<JobId>::new(), "6 GPUs would take 2 of strict's reserved 4");
    assert_eq!(reason_of(&d, 1), PendingReason::InsufficientCapacity);
    s.pending = vec![job(2, 3, 4, 1)];
    assert_eq!(admitted(&schedule(&s)), vec![2], "the 4 GPUs open and d lend are free to borrow");
}

#[test]
fn a_reclaim_that_waits_for_the_borrowers_minimum_runtime_says_so_and_when_then_happens() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 4, 4)]);
    // b runs production work on its reserved 4 GPUs and borrows a's idle 4 with two jobs
    // started 1 and 2 minutes ago; the minimum runtime before preemption is 5 minutes.
    let minute = 60_000;
    start(&mut s, job(1, 1, 4, 0), HOUR);
    start(&mut s, job(2, 1, 2, 1), minute);
    start(&mut s, job(3, 1, 2, 1), 2 * minute);
    s.pending = vec![job(10, 0, 4, 1)];
    let d = schedule(&s);
    assert!(d.preemptions.is_empty(), "neither borrower has run its minimum");
    // Both are needed: the later of their minimum runtimes' ends.
    assert_eq!(reason_of(&d, 10), PendingReason::VictimsInMinimumRuntime { at_ms: NOW + 4 * minute });
    let pending = pending_of(&d, 10);
    assert_eq!((pending.figures.needs, pending.figures.free), (4000, 0));
    assert!(pending.expected_start_ms.is_some_and(|t| t >= NOW + 4 * minute), "{pending:?}");
    // Once they have, the reclaim happens.
    s.now_ms += 4 * minute;
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 10), PendingReason::WaitingForReclaim);
    assert_eq!(d.preemptions.len(), 2);
}

#[test]
fn a_job_no_young_victim_could_make_room_for_waits_for_capacity() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 4, 4)]);
    // b's young jobs are within its own reserved quota: no one may take them.
    start(&mut s, job(1, 1, 4, 1), 60_000);
    start(&mut s, job(2, 0, 4, 1), HOUR);
    s.pending = vec![job(10, 0, 4, 1)];
    let d = schedule(&s);
    assert!(
        matches!(reason_of(&d, 10), PendingReason::InsufficientCapacity | PendingReason::FairShareBehind { .. }),
        "{:?}",
        reason_of(&d, 10)
    );
}

#[test]
fn a_victims_own_grace_period_is_what_it_gets_and_what_the_reclaimers_start_waits_for() {
    let mut s = cluster(1, vec![team("a", 4, 4), team("b", 4, 4)]);
    // b borrows a's idle 4 GPUs with a job that asks for 2 s to checkpoint, not its
    // priority class's 30.
    start(&mut s, job(1, 1, 4, 0), HOUR);
    let mut borrower = job(2, 1, 4, 1);
    borrower.grace_ms = Some(2_000);
    start(&mut s, borrower, HOUR);
    s.pending = vec![job(10, 0, 4, 1)];
    let d = schedule(&s);
    assert_eq!(d.preemptions.len(), 1);
    assert_eq!((d.preemptions[0].victim, d.preemptions[0].grace_ms), (2, 2_000));
    let pending = pending_of(&d, 10);
    assert_eq!(pending.reason, PendingReason::WaitingForReclaim);
    let expected = pending.expected_start_ms.expect("an expected start");
    assert!(expected <= NOW + 2_000, "expected at {} ms from now, after the victim's own grace", expected - NOW);
}

#[test]
fn the_reasons_a_rolling_update_reads_as_no_room_are_reasons_the_engine_gives() {
    for code in crate::domain::service::NO_ROOM_REASONS {
        assert!(PendingReason::CODES.contains(&code), "{code} is no pending reason");
    }
}

#[test]
fn a_reclaim_that_must_take_a_borrowers_gang_across_its_reserved_line_is_not_cut_short() {
    // b reserves 3 and runs one 4-GPU job: it borrows 1. a runs 3 of its 6 reserved and asks
    // for 3 more; 1 GPU is free. Only b's whole gang makes room, more than b borrows.
    let mut s = cluster(1, vec![team("a", 6, 0), team("b", 3, 5)]);
    start(&mut s, job(1, 1, 4, 1), HOUR);
    start(&mut s, job(2, 0, 3, 0), HOUR);
    s.pending = vec![job(10, 0, 3, 0)];
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 10), PendingReason::WaitingForReclaim);
    let victims: Vec<(JobId, PreemptReason)> = d.preemptions.iter().map(|p| (p.victim, p.reason)).collect();
    assert_eq!(victims, vec![(1, PreemptReason::Reclaim)]);
    assert_eq!(d, super::engine::run_exhaustive(&s));
}

/// Team a alone on one node, 6 of its 8 GPUs busy; two 2-GPU jobs wait: 1 (submitted first)
/// of a kind that has run for hours, 2 of a kind that has run for minutes.
fn a_long_and_a_short_job_wait_for_two_gpus() -> Snapshot {
    let mut s = cluster(1, vec![team("a", 8, 0)]);
    start(&mut s, job(9, 0, 6, 1), HOUR);
    let mut history = runtime::RuntimeHistory::default();
    for m in 1..=9 {
        history.record(0, Some(7), m * 60_000);
        history.record(0, Some(8), m * HOUR / 3);
    }
    s.history = std::sync::Arc::new(history);
    s.pending = vec![job(1, 0, 2, 1), job(2, 0, 2, 1)];
    s.pending[0].kind = Some(8);
    s.pending[1].kind = Some(7);
    s.config.queue_order = QueueOrder::ServiceIndex { starvation_ms: DEFAULT_STARVATION_MS, threshold_gpu_ms: None };
    s
}

#[test]
fn a_job_expected_to_run_minutes_goes_before_its_teams_earlier_job_expected_to_run_hours() {
    let s = a_long_and_a_short_job_wait_for_two_gpus();
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![2]);
    assert_eq!(d.pending.iter().find(|p| p.job == 1).map(|p| p.position), Some(2));
}

#[test]
fn in_arrival_order_and_under_the_quota_baseline_the_earlier_job_goes_first() {
    let mut s = a_long_and_a_short_job_wait_for_two_gpus();
    s.config.queue_order = QueueOrder::Arrival;
    assert_eq!(admitted(&schedule(&s)), vec![1]);
    let mut s = a_long_and_a_short_job_wait_for_two_gpus();
    s.config.policy = Policy::QuotaNoHistory;
    assert_eq!(admitted(&schedule(&s)), vec![1]);
}

#[test]
fn a_job_that_waited_past_the_starvation_bound_goes_before_shorter_ones() {
    let mut s = a_long_and_a_short_job_wait_for_two_gpus();
    s.pending[0].submitted_ms = NOW - DEFAULT_STARVATION_MS;
    s.pending[0].queued_ms = NOW - DEFAULT_STARVATION_MS;
    assert_eq!(admitted(&schedule(&s)), vec![1]);
}

#[test]
fn the_starvation_bound_counts_from_when_a_job_last_entered_the_queue_not_from_its_submission() {
    // Submitted long ago, but preempted and back in the queue only for an hour.
    let mut s = a_long_and_a_short_job_wait_for_two_gpus();
    s.pending[0].submitted_ms = NOW - 2 * DEFAULT_STARVATION_MS;
    assert_eq!(admitted(&schedule(&s)), vec![2]);
}

#[test]
fn a_job_that_already_ran_a_while_goes_after_a_fresh_one_of_its_kind() {
    // Most runs of the kind end within minutes, a few take hours: one that has run for an
    // hour is one of the few, so the fresh job, submitted later, is likelier to end soon.
    let mut s = a_long_and_a_short_job_wait_for_two_gpus();
    let mut history = runtime::RuntimeHistory::default();
    for m in 1..=8 {
        history.record(0, Some(7), m * 60_000);
    }
    history.record(0, Some(7), 3 * HOUR);
    history.record(0, Some(7), 4 * HOUR);
    s.history = std::sync::Arc::new(history);
    s.pending[0].kind = Some(7);
    s.pending[0].attained_ms = HOUR;
    assert_eq!(admitted(&schedule(&s)), vec![2]);
    s.pending[0].attained_ms = 0;
    assert_eq!(admitted(&schedule(&s)), vec![1], "without its hour the earlier job goes first");
}

/// Team a, within its reserved 8 GPUs, fills one node: job 9 (4 GPUs) has run 2 hours, 8
/// GPU-hours; job 8 (4 GPUs) 30 minutes, 2 GPU-hours. Its fresh 4-GPU job 1 of the same
/// priority waits, with least-attained-service preemption above 4 GPU-hours (not the
/// default's one, so that the two running jobs fall on either side).
fn a_fresh_job_waits_behind_its_teams_long_runner() -> Snapshot {
    let mut s = cluster(1, vec![team("a", 8, 0), team("b", 0, 8)]);
    start(&mut s, job(9, 0, 4, 1), 2 * HOUR);
    start(&mut s, job(8, 0, 4, 1), HOUR / 2);
    s.pending = vec![job(1, 0, 4, 1)];
    s.config.queue_order =
        QueueOrder::ServiceIndex { starvation_ms: DEFAULT_STARVATION_MS, threshold_gpu_ms: Some(4 * HOUR) };
    s
}

#[test]
fn a_job_with_little_service_takes_the_place_of_its_teams_job_of_its_priority_past_the_threshold() {
    let s = a_fresh_job_waits_behind_its_teams_long_runner();
    let d = schedule(&s);
    assert_eq!(
        d.preemptions.iter().map(|p| (p.victim, p.for_job, p.reason)).collect::<Vec<_>>(),
        vec![(9, 1, PreemptReason::LeastService)],
        "the job past 4 GPU-hours gives way, the one at 2 does not"
    );
    assert_eq!(reason_of(&d, 1), PendingReason::WaitingForReclaim);
}

#[test]
fn least_attained_service_preempts_only_below_the_threshold_within_the_team_and_its_priority() {
    let expect_none = |s: &Snapshot, why: &str| {
        let d = schedule(s);
        assert!(d.preemptions.is_empty(), "{why}: {:?}", d.preemptions);
    };
    let mut s = a_fresh_job_waits_behind_its_teams_long_runner();
    s.pending[0].attained_ms = HOUR;
    expect_none(&s, "4 GPUs for an hour is already at the threshold");
    let mut s = a_fresh_job_waits_behind_its_teams_long_runner();
    s.pending[0].team = 1;
    expect_none(&s, "another team's job takes nothing from a team within its reserved quota");
    let mut s = a_fresh_job_waits_behind_its_teams_long_runner();
    s.pending[0].priority = 2;
    expect_none(&s, "a lower-priority job takes nothing");
    let mut s = a_fresh_job_waits_behind_its_teams_long_runner();
    s.running[0].spec.queued_ms = s.running[0].started_ms - DEFAULT_STARVATION_MS;
    expect_none(&s, "a job the starvation bound let through runs its attempt");
    let mut s = a_fresh_job_waits_behind_its_teams_long_runner();
    s.config.queue_order = QueueOrder::ServiceIndex { starvation_ms: DEFAULT_STARVATION_MS, threshold_gpu_ms: None };
    expect_none(&s, "without a threshold");
    let mut s = a_fresh_job_waits_behind_its_teams_long_runner();
    s.config.policy = Policy::QuotaNoHistory;
    expect_none(&s, "under the quota baseline");
}

#[test]
fn a_job_past_the_threshold_counts_its_earlier_attempts() {
    // Job 8 has run 30 minutes now, but 90 minutes before it was preempted: 8 GPU-hours.
    let mut s = a_fresh_job_waits_behind_its_teams_long_runner();
    s.running[0].started_ms = NOW - HOUR / 2;
    s.running[1].spec.attained_ms = 90 * 60_000;
    let d = schedule(&s);
    assert_eq!(d.preemptions.iter().map(|p| p.victim).collect::<Vec<_>>(), vec![8]);
}

#[test]
fn priority_still_goes_before_expected_service() {
    let mut s = a_long_and_a_short_job_wait_for_two_gpus();
    s.pending[0].priority = 0;
    assert_eq!(admitted(&schedule(&s)), vec![1]);
}

#[test]
fn a_job_that_could_preempt_its_own_team_waits_its_rank_and_its_teams_victim_does_not_take_the_room_back() {
    // t1 and t2 share their parent's limit of 6 GPUs. t1's experiment 1000 preempted t1's
    // scavenger job 1 last cycle, which is back in the queue; t2's experiment 1001 is over
    // t2's own limit and could preempt t2's scavenger job 2. Decided ahead of the ranking,
    // 1001 would hold the parent's quota, 1000 would not fit it, job 1 would run again in the
    // room freed for 1000, and next cycle 1000 would preempt it again.
    let mut parent = team("t0", 4, 2);
    parent.quotas.get_mut(&0).unwrap().lendable = 0;
    let mut t1 = team("t1", 4, 1);
    t1.parent = Some(0);
    let mut t2 = team("t2", 0, 3);
    t2.parent = Some(0);
    let mut s = cluster(1, vec![parent, t1, t2]);
    start(&mut s, job(3, 1, 2, 0), HOUR);
    start(&mut s, job(2, 2, 1, 2), HOUR);
    s.pending = vec![job(1000, 1, 3, 1), job(1001, 2, 3, 1), job(1, 1, 1, 2)];
    for j in &mut s.pending {
        j.submitted_ms = NOW - HOUR;
    }
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![1000]);
    assert!(d.preemptions.is_empty(), "{:?}", d.preemptions);
    assert!(matches!(reason_of(&d, 1), PendingReason::BurstLimit { .. }), "{:?}", reason_of(&d, 1));
}

/// Two 8-GPU nodes with 64 cores each; node 0 already runs a 6-GPU job taking 40 cores.
fn cpu_bound_cluster(placement: Placement) -> Snapshot {
    let mut s = cluster(2, vec![team("a", 16, 0)]);
    for n in &mut s.nodes {
        n.host = Some(Host { cpu_millis: 64_000, memory_mib: 512 * 1024 });
    }
    s.config.placement = placement;
    let mut busy = job(1, 0, 6, 0);
    busy.host = Host { cpu_millis: 40_000, memory_mib: 1024 };
    start(&mut s, busy, HOUR);
    assert_eq!(s.running[0].placement[0].node, 0);
    s
}

#[test]
fn a_replica_whose_cpus_do_not_fit_beside_the_fullest_nodes_gpus_goes_to_a_node_where_they_do() {
    let mut s = cpu_bound_cluster(Placement::BestFit);
    // Best-fit by GPUs alone is node 0 (2 GPUs free), but only 24 of its cores are.
    let mut wide = job(2, 0, 2, 0);
    wide.host = Host { cpu_millis: 32_000, memory_mib: 1024 };
    let mut narrow = job(3, 0, 2, 0);
    narrow.host = Host { cpu_millis: 8_000, memory_mib: 1024 };
    s.pending = vec![wide, narrow];
    let d = schedule(&s);
    let node_of = |id| d.admissions.iter().find(|a| a.job == id).map(|a| a.placement[0].node);
    assert_eq!(node_of(2), Some(1), "32 cores do not fit beside node 0's free GPUs");
    assert_eq!(node_of(3), Some(0), "8 cores do: best-fit keeps node 1's GPUs together");
    let taken = d.admissions.iter().find(|a| a.job == 2).unwrap().placement[0].host;
    assert_eq!(taken.cpu_millis, 32_000, "the placement carries the CPUs it takes");
}

#[test]
fn a_replica_that_fits_on_no_node_with_its_cpus_never_fits() {
    let mut s = cpu_bound_cluster(Placement::BestFit);
    let mut huge = job(2, 0, 1, 0);
    huge.host = Host { cpu_millis: 65_000, memory_mib: 1024 };
    s.pending = vec![huge];
    let d = schedule(&s);
    assert!(d.admissions.is_empty());
    assert_eq!(reason_of(&d, 2), PendingReason::NeverFits);
}

#[test]
fn by_fragmentation_a_replica_goes_where_it_strands_the_fewest_gpus_for_the_shapes_that_arrive() {
    // Waiting: one GPU with 16 cores, then jobs of 1 GPU with 24 cores. Best-fit puts the first
    // on node 0 (2 GPUs free, 24 cores): 8 cores are left, and its last GPU is stranded for
    // every shape. By fragmentation it goes to node 1, where the cores left still hold every
    // shape, and node 0 keeps its 24 cores for one 24-core job.
    let pending = |s: &mut Snapshot| {
        let mut first = job(2, 0, 1, 0);
        first.host = Host { cpu_millis: 16_000, memory_mib: 1024 };
        let mut rest: Vec<JobSpec> = (3..8)
            .map(|id| {
                let mut j = job(id, 0, 1, 0);
                j.host = Host { cpu_millis: 24_000, memory_mib: 1024 };
                j
            })
            .collect();
        s.pending = vec![first];
        s.pending.append(&mut rest);
    };
    let mut best = cpu_bound_cluster(Placement::BestFit);
    pending(&mut best);
    let by_best_fit = schedule(&best);
    let mut fgd = cpu_bound_cluster(Placement::Fragmentation);
    pending(&mut fgd);
    let by_fragmentation = schedule(&fgd);
    let node_of = |d: &Decisions, id| d.admissions.iter().find(|a| a.job == id).map(|a| a.placement[0].node);
    assert_eq!(node_of(&by_best_fit, 2), Some(0));
    assert_eq!(node_of(&by_fragmentation, 2), Some(1));
    // Best-fit: 16 cores on node 0, two 24-core jobs on node 1 (16 cores left there, 8 on
    // node 0). By fragmentation: 16 + 24 + 24 cores on node 1 and 24 on node 0: one job more.
    assert_eq!(by_best_fit.admissions.len(), 3, "{:?}", admitted(&by_best_fit));
    assert_eq!(by_fragmentation.admissions.len(), 4, "{:?}", admitted(&by_fragmentation));
}

#[test]
fn a_job_whose_gpus_are_free_but_whose_cpus_are_not_says_so() {
    let mut s = cpu_bound_cluster(Placement::BestFit);
    let mut hungry = job(2, 0, 6, 0);
    hungry.host = Host { cpu_millis: 60_000, memory_mib: 1024 };
    start(&mut s, hungry, HOUR);
    // Node 0: 2 GPUs and 24 cores free; node 1: 2 GPUs and 4 cores.
    let mut wide = job(3, 0, 2, 0);
    wide.host = Host { cpu_millis: 32_000, memory_mib: 1024 };
    s.pending = vec![wide];
    let d = schedule(&s);
    assert!(d.admissions.is_empty());
    assert_eq!(reason_of(&d, 3), PendingReason::NoHostFit { asks: Host { cpu_millis: 32_000, memory_mib: 1024 } });
    assert_eq!(reason_of(&d, 3).code(), "no_cpu_memory_fit");
}

/// One full 8-GPU node running team b's experiment, which borrows team a's idle quota, and
/// team a's production job of 4 GPUs arriving now, with a two-minute preemption delay.
fn a_reclaim_with_a_delay() -> Snapshot {
    let mut s = cluster(1, vec![team("a", 4, 0), team("b", 4, 4)]);
    start(&mut s, job(1, 1, 8, 1), HOUR);
    let mut arriving = job(10, 0, 4, 0);
    arriving.queued_ms = NOW;
    arriving.preemption_delay_ms = Some(2 * 60_000);
    s.pending = vec![arriving];
    s
}

#[test]
fn within_its_preemption_delay_a_job_preempts_no_one_and_says_until_when() {
    let s = a_reclaim_with_a_delay();
    let d = schedule(&s);
    assert!(d.preemptions.is_empty(), "{:?}", d.preemptions);
    assert_eq!(reason_of(&d, 10), PendingReason::PreemptionDelayed { until_ms: NOW + 120_000, victims: 1 });
    // Its expected start is when its victim would be gone: the delay, then the grace period.
    let pending = d.pending.iter().find(|p| p.job == 10).unwrap();
    assert_eq!(pending.played_start_ms, Some(NOW + 120_000 + 30_000), "{pending:?}");
}

#[test]
fn capacity_that_arrives_within_the_delay_is_taken_and_no_one_is_preempted() {
    let mut s = a_reclaim_with_a_delay();
    s.now_ms += 60_000;
    // An autoscaler added a node in the meantime.
    let mut added = s.nodes[0].clone();
    added.name = "n1".into();
    s.nodes.push(added);
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![10]);
    assert_eq!(d.admissions[0].placement[0].node, 1);
    assert!(d.preemptions.is_empty());
}

#[test]
fn once_the_delay_has_passed_without_capacity_the_job_preempts_as_it_would_have_at_once() {
    let mut s = a_reclaim_with_a_delay();
    s.now_ms += 120_000;
    let d = schedule(&s);
    assert_eq!(reason_of(&d, 10), PendingReason::WaitingForReclaim);
    assert_eq!(d.preemptions.iter().map(|p| (p.victim, p.reason)).collect::<Vec<_>>(), [(1, PreemptReason::Reclaim)]);
    // Without a delay it does the same at once.
    let mut s = a_reclaim_with_a_delay();
    s.pending[0].preemption_delay_ms = None;
    assert_eq!(schedule(&s).preemptions.len(), 1);
}

#[test]
fn a_priority_classes_delay_applies_to_its_jobs_and_a_jobs_own_overrides_it() {
    let mut s = a_reclaim_with_a_delay();
    s.pending[0].preemption_delay_ms = None;
    s.priorities[0].preemption_delay_ms = 60_000;
    assert_eq!(reason_of(&schedule(&s), 10), PendingReason::PreemptionDelayed { until_ms: NOW + 60_000, victims: 1 });
    s.pending[0].preemption_delay_ms = Some(0);
    assert_eq!(reason_of(&schedule(&s), 10), PendingReason::WaitingForReclaim);
}

#[test]
fn the_room_a_delayed_job_would_take_is_not_preempted_for_a_job_ranked_after_it() {
    let mut s = a_reclaim_with_a_delay();
    // Team a's second job, of the same class and no delay, ranks after the first.
    let mut second = job(11, 0, 4, 0);
    second.queued_ms = NOW;
    s.pending.push(second);
    let d = schedule(&s);
    assert!(d.preemptions.is_empty(), "{:?}", d.preemptions);
    assert!(matches!(reason_of(&d, 10), PendingReason::PreemptionDelayed { .. }));
    assert_ne!(reason_of(&d, 11), PendingReason::WaitingForReclaim);
}

/// Team a's elastic job of 1-GPU replicas, `min` to `max`, running with `holds`.
fn elastic(s: &mut Snapshot, id: JobId, holds: u16, min: u16, max: u16, priority: PriorityId) {
    let mut spec = job(id, 0, 1, priority);
    spec.replicas = holds;
    spec.elastic = Some(Elastic { min_replicas: min, max_replicas: max });
    start(s, spec, HOUR);
}

#[test]
fn a_running_elastic_gang_grows_one_replica_at_a_time_into_free_gpus_up_to_its_maximum() {
    let mut s = cluster(1, vec![team("a", 8, 0), team("b", 0, 0)]);
    elastic(&mut s, 1, 2, 2, 6, 1);
    let d = schedule(&s);
    assert_eq!(d.growths.len(), 1);
    assert_eq!((d.growths[0].job, d.growths[0].placement.len()), (1, 4));
    assert!(d.preemptions.is_empty() && d.shrinks.is_empty());
}

#[test]
fn an_elastic_gang_grows_only_in_its_own_cluster() {
    // Two nodes of 8, each a cluster of its own; the gang runs on n0 with 6 of its 8 GPUs.
    let mut s = cluster(2, vec![team("a", 16, 0), team("b", 0, 0)]);
    s.nodes[1].cluster = 1;
    elastic(&mut s, 1, 6, 2, 16, 1);
    assert!(s.running[0].placement.iter().all(|r| r.node == 0));
    let d = schedule(&s);
    let grown: Vec<NodeId> = d.growths.iter().flat_map(|g| g.placement.iter().map(|r| r.node)).collect();
    assert_eq!(grown, [0, 0], "the 8 idle GPUs of the other cluster are not the gang's to join");
}

#[test]
fn a_gang_is_admitted_within_one_cluster_or_waits() {
    // Three nodes of 8: n0 in cluster 0, n1 and n2 in cluster 1; n0 is half busy.
    let mut s = cluster(3, vec![team("a", 24, 0), team("b", 8, 0)]);
    s.nodes[1].cluster = 1;
    s.nodes[2].cluster = 1;
    start(&mut s, job(1, 1, 4, 1), HOUR);
    s.pending = vec![job(10, 0, 4, 1)];
    s.pending[0].replicas = 3;
    let d = schedule(&s);
    assert_eq!(admitted(&d), [10]);
    assert!(d.admissions[0].placement.iter().all(|r| r.node != 0), "{:?}", d.admissions[0].placement);
    // Twelve free in cluster 1 once half of n2 is busy too: a gang of 16 waits, though 16
    // are free in all.
    s.pending[0].replicas = 4;
    let on_n2 = ReplicaPlacement { node: 2, units: (0..4).map(|u| (u, 1000)).collect(), host: Default::default() };
    s.running.push(RunningJob { placement: vec![on_n2], spec: job(2, 1, 4, 1), ..s.running[0].clone() });
    let d = schedule(&s);
    assert!(admitted(&d).is_empty());
    assert_eq!(reason_of(&d, 10), PendingReason::NoTopologyFit { within: None }, "GPUs are free, not in one cluster");
}

#[test]
fn an_elastic_gang_grows_only_within_its_teams_quota() {
    let mut s = cluster(1, vec![team("a", 3, 1), team("b", 4, 0)]);
    elastic(&mut s, 1, 2, 2, 8, 1);
    let d = schedule(&s);
    assert_eq!(d.growths.iter().map(|g| g.placement.len()).sum::<usize>(), 2, "reserved 3 + burst 1");
    assert_eq!(d.growths[0].borrowing, [false, true], "the third GPU is reserved, the fourth borrowed");
    // A class that cannot be preempted grows within reserved quota only.
    let mut s = cluster(1, vec![team("a", 3, 1), team("b", 4, 0)]);
    elastic(&mut s, 1, 2, 2, 8, 0);
    let d = schedule(&s);
    assert_eq!(d.growths.iter().map(|g| g.placement.len()).sum::<usize>(), 1);
}

#[test]
fn an_elastic_gang_does_not_grow_while_a_job_of_its_class_waits_for_gpus() {
    let mut s = cluster(1, vec![team("a", 8, 0), team("b", 0, 8)]);
    elastic(&mut s, 1, 2, 2, 8, 1);
    // Team b's 8-GPU gang cannot fit in the 6 free GPUs, and takes nothing from a.
    s.pending = vec![job(10, 1, 8, 1)];
    let d = schedule(&s);
    assert!(d.growths.is_empty(), "{:?}", d.growths);
    assert!(d.admissions.is_empty());
}

#[test]
fn a_reclaim_takes_an_elastic_gangs_extras_last_added_first_and_leaves_the_gang_running() {
    // Team b borrows all of a's 8 reserved GPUs with one elastic gang: 2 needed, 6 extras.
    let mut s = cluster(1, vec![team("a", 8, 0), team("b", 0, 8)]);
    let mut spec = job(1, 1, 1, 1);
    spec.replicas = 8;
    spec.elastic = Some(Elastic { min_replicas: 2, max_replicas: 8 });
    start(&mut s, spec, HOUR);
    // a asks for 4 of its GPUs back.
    s.pending = vec![job(10, 0, 4, 0)];
    let d = schedule(&s);
    assert!(d.preemptions.is_empty(), "the gang itself is not preempted: {:?}", d.preemptions);
    let mut taken: Vec<u16> = d.shrinks.iter().map(|k| k.replica).collect();
    taken.sort_unstable();
    assert_eq!(taken, [4, 5, 6, 7]);
    assert!(d.shrinks.iter().all(|k| k.job == 1 && k.for_job == 10 && k.reason == PreemptReason::Reclaim));
    assert_eq!(reason_of(&d, 10), PendingReason::WaitingForReclaim);
    // Asking for 7 takes all six extras and then the gang itself, which goes whole.
    s.pending = vec![job(10, 0, 7, 0)];
    let d = schedule(&s);
    assert_eq!(d.preemptions.iter().map(|p| p.victim).collect::<Vec<_>>(), [1]);
    assert!(d.shrinks.is_empty(), "its extras go with it: {:?}", d.shrinks);
}

#[test]
fn an_extra_is_given_back_to_a_job_of_its_own_team_of_the_same_priority_and_kept_from_a_lower_one() {
    // Team a's gang grew into the whole node: 2 needed, 6 extras, all within a's reserved 8.
    let mut s = cluster(1, vec![team("a", 8, 0), team("b", 0, 8)]);
    elastic(&mut s, 1, 8, 2, 8, 1);
    // A 3-GPU experiment of a's own arrives: the gang's growth does not make it wait.
    s.pending = vec![job(10, 0, 3, 1)];
    let d = schedule(&s);
    assert!(d.preemptions.is_empty(), "the gang itself keeps running: {:?}", d.preemptions);
    let mut taken: Vec<u16> = d.shrinks.iter().map(|k| k.replica).collect();
    taken.sort_unstable();
    assert_eq!(taken, [5, 6, 7], "the last three added");
    assert!(d.shrinks.iter().all(|k| k.for_job == 10 && k.reason == PreemptReason::OwnTeam), "{:?}", d.shrinks);
    assert_eq!(reason_of(&d, 10), PendingReason::WaitingForReclaim);
    // A scavenger of a's ranks below the gang: it waits, and takes nothing.
    s.pending = vec![job(10, 0, 3, 2)];
    let d = schedule(&s);
    assert!(d.shrinks.is_empty() && d.preemptions.is_empty(), "{d:?}");
    assert_eq!(reason_of(&d, 10), PendingReason::BurstLimit { team: 0 }, "a holds its 8 with the gang's extras");
    // Nor does a job of another team take a's extras within a's reserved quota.
    s.pending = vec![job(10, 1, 3, 1)];
    let d = schedule(&s);
    assert!(d.shrinks.is_empty() && d.preemptions.is_empty(), "{d:?}");
}

#[test]
fn the_extras_of_a_class_that_cannot_be_preempted_are_never_taken() {
    let mut s = cluster(1, vec![team("a", 8, 0), team("b", 0, 8)]);
    elastic(&mut s, 1, 8, 2, 8, 0);
    // Team a's own higher-priority work cannot take them either: production is not preemptible.
    s.priorities.push(PriorityClass { name: "urgent".into(), priority: 900, ..s.priorities[0].clone() });
    s.pending = vec![job(10, 0, 2, 3)];
    let d = schedule(&s);
    assert!(d.shrinks.is_empty() && d.preemptions.is_empty(), "{d:?}");
}

#[test]
fn an_extra_still_leaving_is_listed_as_a_stopping_job_of_its_own_and_its_gpus_go_to_the_job_it_left_for() {
    // Team b's elastic gang holds 6 GPUs (2 needed); one more extra is leaving for a's job,
    // listed as a one-replica running job of the gang's id, stopping.
    let mut s = cluster(1, vec![team("a", 8, 0), team("b", 0, 8)]);
    let mut spec = job(1, 1, 1, 1);
    spec.replicas = 7;
    spec.elastic = Some(Elastic { min_replicas: 2, max_replicas: 8 });
    start(&mut s, spec, HOUR);
    let mut gang = s.running.pop().unwrap();
    let leaving = gang.placement.pop().unwrap();
    gang.spec.replicas = 6;
    let stopping = RunningJob {
        spec: JobSpec { replicas: 1, elastic: None, ..gang.spec.clone() },
        placement: vec![leaving],
        terminating: true,
        ..gang.clone()
    };
    s.running = vec![gang, stopping];
    // a's job of 2 GPUs: the free one and the leaving one, so nothing more is taken.
    s.pending = vec![job(10, 0, 2, 0)];
    let d = schedule(&s);
    assert!(d.shrinks.is_empty() && d.preemptions.is_empty(), "{d:?}");
    assert_eq!(reason_of(&d, 10), PendingReason::WaitingForReclaim);
    assert!(d.growths.is_empty(), "no growth while a job waits: {:?}", d.growths);
}

/// The demo's H100s at its fourth act, all 64 held by `running` (job id, team): research
/// (32 + 32) over nlp (16 + 32) and vision (16 + 16), and prod-inference (16 + 0), whose jobs
/// serve (production); everyone else's are experiments, started an hour ago.
fn demo_act_four(running: &[(JobId, TeamId)]) -> Snapshot {
    let mut s =
        cluster(8, vec![team("research", 32, 32), team("nlp", 16, 32), team("vision", 16, 16), team("prod", 16, 0)]);
    s.teams[1].parent = Some(0);
    s.teams[2].parent = Some(0);
    for &(id, t) in running {
        start(&mut s, job(id, t, 8, if t == 3 { 0 } else { 1 }), HOUR);
    }
    s
}

#[test]
fn a_production_job_waits_for_the_experiment_it_stopped_instead_of_stopping_another() {
    let mut s = demo_act_four(&[(1, 3), (2, 3), (10, 2), (11, 2), (12, 2), (20, 1), (21, 1), (22, 1)]);
    // Cycle 1 chose nlp's sweep 22 for the production job, which is stopping.
    s.running[7].terminating = true;
    s.pending = vec![job(30, 1, 8, 0), job(23, 1, 8, 1), job(24, 1, 8, 1)];
    let d = schedule(&s);
    assert!(d.preemptions.is_empty(), "{:?} {:?}", d.preemptions, d.pending);
    assert_eq!(reason_of(&d, 30), PendingReason::WaitingForReclaim);
    // The stopping sweep's GPUs are the production job's, not its requeued teammates'.
    assert_eq!(reason_of(&d, 23), PendingReason::ReservedFor { job: 30 });
}

#[test]
fn a_production_job_keeps_the_gpus_it_stopped_an_experiment_for_against_another_teams_burst_job() {
    // The demo's fourth act as it happens: vision's third detector, reclaimed in act three,
    // waits for burst beside vision's two reserved runs; nlp runs four sweeps, one of which
    // cycle 1 stopped for nlp's production evaluation.
    let mut s = demo_act_four(&[(1, 3), (2, 3), (10, 2), (11, 2), (20, 1), (21, 1), (22, 1), (23, 1)]);
    s.running[6].terminating = true;
    s.pending = vec![job(30, 1, 8, 0), job(24, 1, 8, 1), job(12, 2, 8, 1)];
    let d = schedule(&s);
    assert!(d.preemptions.is_empty(), "{:?} {:?}", d.preemptions, d.pending);
    assert_eq!(reason_of(&d, 30), PendingReason::WaitingForReclaim);
    assert_ne!(reason_of(&d, 12), PendingReason::WaitingForReclaim);
    // Once the sweep is gone, its GPUs go to the evaluation, and still no one else stops.
    s.running.remove(6);
    let d = schedule(&s);
    assert_eq!(admitted(&d), vec![30]);
    assert!(d.preemptions.is_empty(), "{:?}", d.preemptions);
}
