//! What the expected starts learn from, read from the database: the runtimes of recently
//! finished jobs (`scheduler::runtime`) and the errors of recent forecasts
//! (`scheduler::forecast_errors`). Both change slowly, so the leader reads them at most every
//! [`REFRESH`], and so does each replica for its dry runs (`AppState::forecast`), which then
//! answer from inputs as recent as the leader's.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    db,
    domain::TeamId,
    scheduler::{runtime::kind_of, ForecastErrors, PriorityId, RuntimeHistory},
};

/// How long what was read stands before it is read again.
pub const REFRESH: Duration = Duration::from_secs(30);

/// Finished jobs whose runtimes are kept: per team and name, the newest few hundred of
/// a busy platform's last hours.
pub const RUNTIMES: i64 = 5_000;

/// Forecast errors read, of started jobs and of waiting jobs each (see
/// [`scheduler::forecast_errors::WINDOW`](crate::scheduler::forecast_errors::WINDOW)).
pub const ERRORS: i64 = 5_000;

/// The forecast's inputs as last read. Cloning shares what was read.
#[derive(Debug, Default, Clone)]
pub struct ForecastInputs {
    read_at: Option<Instant>,
    runtimes: Arc<Vec<db::forecast::Runtime>>,
    /// Errors of started jobs (newest first) and of waiting ones.
    errors: Arc<(Vec<db::forecast::ForecastError>, Vec<db::forecast::ForecastError>)>,
    /// The history and errors built from what was read, for the engine's numbering of teams
    /// and priority classes they were built with.
    built: Option<Built>,
}

/// See [`ForecastInputs::built`].
#[derive(Debug, Clone)]
struct Built {
    team_index: HashMap<TeamId, u32>,
    priority_index: HashMap<String, PriorityId>,
    history: Arc<RuntimeHistory>,
    errors: Arc<ForecastErrors>,
}

impl ForecastInputs {
    /// Reads them again if they are older than [`REFRESH`] (or never read).
    pub async fn refresh(&mut self, pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
        if self.read_at.is_some_and(|at| at.elapsed() < REFRESH) {
            return Ok(());
        }
        self.runtimes = Arc::new(db::forecast::recent_runtimes(pool, RUNTIMES).await?);
        self.errors = Arc::new(db::forecast::errors(pool, ERRORS).await?);
        self.built = None;
        self.read_at = Some(Instant::now());
        Ok(())
    }

    /// Runtime history and forecast errors with teams and priority classes as the engine
    /// numbers them (`team_index`, `priority_index`).
    pub fn for_snapshot(
        &mut self,
        team_index: &HashMap<TeamId, u32>,
        priority_index: &HashMap<String, PriorityId>,
    ) -> (Arc<RuntimeHistory>, Arc<ForecastErrors>) {
        if let Some(b) = &self.built {
            if &b.team_index == team_index && &b.priority_index == priority_index {
                return (b.history.clone(), b.errors.clone());
            }
        }
        let mut history = RuntimeHistory::default();
        for r in self.runtimes.iter() {
            if let Some(&team) = team_index.get(&r.team_id) {
                history.record(team, Some(kind_of(&r.name)), r.runtime_ms);
            }
        }
        let (started, waiting) = &*self.errors;
        let mut errors = ForecastErrors::default();
        // Oldest first: the window keeps the newest.
        for e in started.iter().rev() {
            if let Some(&priority) = priority_index.get(&e.priority_class) {
                errors.record(priority, e.forecast_ms, e.actual_ms);
            }
        }
        errors.set_waiting(
            waiting.iter().filter_map(|e| Some((*priority_index.get(&e.priority_class)?, e.forecast_ms, e.actual_ms))),
        );
        let built = Built {
            team_index: team_index.clone(),
            priority_index: priority_index.clone(),
            history: Arc::new(history),
            errors: Arc::new(errors),
        };
        let out = (built.history.clone(), built.errors.clone());
        self.built = Some(built);
        out
    }
}
