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
    scheduler::{runtime::kind_of, ForecastErrors, RuntimeHistory},
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
    errors: Arc<ForecastErrors>,
    /// The history built from `runtimes` for the engine's team numbering it was built with.
    built: Option<(HashMap<TeamId, u32>, Arc<RuntimeHistory>)>,
}

impl ForecastInputs {
    /// Reads them again if they are older than [`REFRESH`] (or never read).
    pub async fn refresh(&mut self, pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
        if self.read_at.is_some_and(|at| at.elapsed() < REFRESH) {
            return Ok(());
        }
        self.runtimes = Arc::new(db::forecast::recent_runtimes(pool, RUNTIMES).await?);
        let (started, waiting) = db::forecast::errors(pool, ERRORS).await?;
        let mut errors = ForecastErrors::default();
        // Oldest first: the window keeps the newest.
        for &(forecast, actual) in started.iter().rev() {
            errors.record(forecast, actual);
        }
        errors.set_waiting(waiting);
        self.errors = Arc::new(errors);
        self.built = None;
        self.read_at = Some(Instant::now());
        Ok(())
    }

    /// Runtime history with teams as the engine numbers them (`team_index`), and the errors.
    pub fn for_snapshot(&mut self, team_index: &HashMap<TeamId, u32>) -> (Arc<RuntimeHistory>, Arc<ForecastErrors>) {
        let history = match &self.built {
            Some((index, history)) if index == team_index => history.clone(),
            _ => {
                let mut history = RuntimeHistory::default();
                for r in self.runtimes.iter() {
                    if let Some(&team) = team_index.get(&r.team_id) {
                        history.record(team, Some(kind_of(&r.name)), r.runtime_ms);
                    }
                }
                let history = Arc::new(history);
                self.built = Some((team_index.clone(), history.clone()));
                history
            }
        };
        (history, self.errors.clone())
    }
}
