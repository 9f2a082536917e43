//! The attempt budgets a fleet applies: each handler's, each route's override, and a
//! default; what `tasks show`, `check` and `retry --more-attempts` count with, and what
//! each member records of itself ([`super::members`]).

use serde::{Deserialize, Serialize};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;

/// Attempt budgets as the fleet applies them, for tasks that set none of their own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Budgets {
    /// Routes whose policy sets max attempts.
    pub routes: Vec<(String, i32)>,
    /// Each handler's max attempts.
    pub handlers: Vec<(String, i32)>,
    /// For a handler this process does not know.
    pub default: i32,
}

impl Budgets {
    /// The budgets a member recorded, as a reader may trust them: none when the record
    /// does not read as budgets (written by hand, or by a release that changed its
    /// shape) or its default is below 1; a handler's or a route's below 1 left out. A
    /// bad record of one member must not stop every reader of the fleet.
    pub fn recorded(value: serde_json::Value) -> Option<Budgets> {
        let mut budgets: Budgets = serde_json::from_value(value).ok()?;
        if budgets.default < 1 {
            return None;
        }
        budgets.handlers.retain(|(_, budget)| *budget >= 1);
        budgets.routes.retain(|(_, budget)| *budget >= 1);
        Some(budgets)
    }

    /// Binds the budgets as the next five parameters, in the order SQL's
    /// `recovery_attempts_allowed(task, ...)` takes them.
    pub(crate) fn bind<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        let (route_names, route_budgets): (Vec<String>, Vec<i32>) =
            self.routes.iter().cloned().unzip();
        let (handler_names, handler_budgets): (Vec<String>, Vec<i32>) =
            self.handlers.iter().cloned().unzip();
        query
            .bind(route_names)
            .bind(route_budgets)
            .bind(handler_names)
            .bind(handler_budgets)
            .bind(self.default)
    }
}
