//! One engine step: every running request's next rows in one forward pass. Each turn's next
//! token, both panes of each comparison, and at most one prefill chunk (bounded while others
//! decode, so a long prompt never stalls the streams) become items of
//! [`Model::forward_batch`]; each sequence then takes its logits back. A request that ends,
//! fails or panics leaves; the others go on at the next step.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use super::error::JobError;
use super::lock;
use super::run::{panic_message, Ended, Task, Worker};
use crate::contract::{ErrorCode, Event};
use crate::generate::compare::CompareNext;
use crate::generate::{GenerateError, Next};
use crate::models::common::{BatchItem, Logits, SoftSpan};

/// Prompt tokens a step runs beside other sequences' decodes until [`Pace`] has measured
/// the steps. A prefill with no decode beside it runs its request's whole chunk.
pub(crate) const PREFILL_BESIDE_DECODES: usize = 32;

/// The least and most prompt tokens [`Pace`] lets a step run beside decodes.
const PACED_CHUNK: (usize, usize) = (8, 256);

/// How long steps take, to size the prefill chunk that runs beside decodes: about one decode
/// step's worth of work, so the streams' next token waits about twice as long while a long
/// prompt is read, never longer (a fixed chunk grows slower as the prompt's context does:
/// measured on the 270M, 32 tokens at 4k deep cost four decode steps of three streams).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pace {
    /// Seconds of a step of decodes only (a moving average).
    decode_step: Option<f64>,
    /// Seconds per prompt token a chunk adds to a step of decodes (a moving average).
    prefill_token: Option<f64>,
}

impl Pace {
    /// Prompt tokens the next step may run beside decodes.
    pub(crate) fn chunk(&self) -> usize {
        match (self.decode_step, self.prefill_token) {
            (Some(d), Some(p)) if p > 0.0 => ((d / p) as usize).clamp(PACED_CHUNK.0, PACED_CHUNK.1),
            _ => PREFILL_BESIDE_DECODES,
        }
    }

    /// A step of `rows` rows, `prefill` of them one prompt chunk, took `secs`.
    pub(crate) fn record(&mut self, secs: f64, rows: usize, prefill: usize) {
        let average = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| 0.8 * o + 0.2 * new));
        if prefill == 0 {
            self.decode_step = average(self.decode_step, secs);
        } else if let (Some(d), true) = (self.decode_step, rows > prefill) {
            self.prefill_token = average(self.prefill_token, (secs - d).max(0.0) / prefill as f64);
        }
    }
}

/// What a request asked of this step.
enum Planned {
    /// Nothing this step (a prefill waiting for the step's one chunk).
    Wait,
    /// Rows to run: (pane, ids); a turn's pane is 0, and its chunk's images' soft tokens.
    Run(Vec<(usize, Vec<u32>)>, Vec<SoftSpan>),
    /// It ended (panicked: its state may be half written).
    Ended(Box<Ended>, bool),
}

impl Worker {
    /// Runs one step of every running request (see the module doc).
    pub(super) fn step_batch(&mut self) {
        // A comparison's scoring may use its own reservation and what no one else holds.
        let free = self.kv_limit().saturating_sub(self.pool.committed_bytes());
        let Some(loaded) = self.loaded.as_ref() else {
            return;
        };
        let n = self.tasks.len();
        if self.next >= n {
            self.next = 0;
        }
        // The step's one prefill chunk goes to the first prefilling request from `next` on.
        let prefilling: Vec<bool> = self.tasks.iter().map(Task::prefilling).collect();
        let pick = (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&i| prefilling[i] && !self.tasks[i].cancel().is_cancelled());
        let decodes = prefilling.iter().any(|p| !p);
        let limit = decodes.then(|| self.pace.chunk());
        if pick.is_some() {
            self.next = pick.map_or(0, |p| p + 1);
        }

        // 1. What each request runs next (its sampled token's text goes out here).
        let mut plans: Vec<Planned> = Vec::with_capacity(n);
        for (i, &pre) in prefilling.iter().enumerate() {
            if pre && Some(i) != pick && !self.tasks[i].cancel().is_cancelled() {
                plans.push(Planned::Wait);
                continue;
            }
            let pool = &mut self.pool;
            let planned = catch_unwind(AssertUnwindSafe(|| match &mut self.tasks[i] {
                Task::Turn {
                    id,
                    turn,
                    sink,
                    cancel,
                } => {
                    let Some(session) = pool.running_session_mut(id) else {
                        // Never: a busy conversation is never spilled or dropped.
                        return ended(
                            Ended::Turn(Some(
                                JobError::new(ErrorCode::Internal, "the conversation left memory")
                                    .to_event(),
                            )),
                            false,
                        );
                    };
                    let mut done = None;
                    let mut emit = |ev: Event| match ev {
                        Event::Done { .. } => done = Some(ev),
                        other => sink(other),
                    };
                    match turn.next(
                        &loaded.tokenizer,
                        session,
                        cancel.is_cancelled(),
                        limit,
                        &mut emit,
                    ) {
                        Ok(Next::Run(ids, soft)) => Planned::Run(vec![(0, ids)], soft),
                        Ok(Next::Finished) => ended(Ended::Turn(done), false),
                        Err(e) => ended(turn_error(e), false),
                    }
                }
                Task::Compare {
                    run,
                    sink,
                    cancel,
                    reserved,
                } => {
                    let room = free.saturating_add(*reserved);
                    let mut room = || room;
                    match run.next(
                        &loaded.model,
                        &loaded.tokenizer,
                        cancel.is_cancelled(),
                        limit,
                        &mut room,
                        &mut |ev| sink(ev),
                    ) {
                        Ok(CompareNext::Run(runs)) => Planned::Run(runs, Vec::new()),
                        Ok(CompareNext::Working) => Planned::Wait,
                        Ok(CompareNext::Finished(fidelity)) => {
                            ended(Ended::Compare(Event::Finished { fidelity }), false)
                        }
                        Err(e) => ended(compare_error(e), false),
                    }
                }
            }));
            plans.push(planned.unwrap_or_else(|panic| {
                ended(self.tasks[i].failed(&panic_message(&*panic)), true)
            }));
        }

        // 2. One forward pass over every row asked for.
        let started = Instant::now();
        let mut owners: Vec<(usize, usize)> = Vec::new();
        let rows: (usize, usize);
        let results = {
            let turn_ids: Vec<_> = self
                .tasks
                .iter()
                .enumerate()
                .filter(|(i, _)| matches!(plans[*i], Planned::Run(..)))
                .filter_map(|(_, t)| match t {
                    Task::Turn { id, .. } => Some(id),
                    Task::Compare { .. } => None,
                })
                .collect();
            let mut sessions = self.pool.running_sessions_mut(&turn_ids).into_iter();
            let mut items: Vec<BatchItem<'_, '_>> = Vec::new();
            for (i, task) in self.tasks.iter_mut().enumerate() {
                let Planned::Run(runs, soft) = &plans[i] else {
                    continue;
                };
                match task {
                    Task::Turn { .. } => {
                        if let (Some(Some(session)), Some((_, ids))) =
                            (sessions.next(), runs.first())
                        {
                            owners.push((i, 0));
                            items.push(BatchItem {
                                ids,
                                cache: session.cache_for_step(),
                                which: Logits::Last,
                                soft,
                            });
                        }
                    }
                    Task::Compare { run, .. } => {
                        for (pane, cache) in run.caches_mut() {
                            if let Some((_, ids)) = runs.iter().find(|(p, _)| *p == pane) {
                                owners.push((i, pane));
                                items.push(BatchItem {
                                    ids,
                                    cache,
                                    which: Logits::Last,
                                    soft: &[],
                                });
                            }
                        }
                    }
                }
            }
            rows = (
                items.iter().map(|it| it.ids.len()).sum(),
                items.iter().map(|it| it.ids.len()).filter(|&n| n > 1).sum(),
            );
            if !items.is_empty() {
                let tokens = rows.0 as u64;
                let mut c = lock(&self.shared.steps);
                c.steps += 1;
                c.sequences += items.len() as u64;
                c.tokens += tokens;
                (c.last_sequences, c.last_tokens) = (items.len() as u64, tokens);
                if items.len() > 1 && items.iter().any(|it| it.ids.len() > 1) {
                    c.prefill_beside_decodes += 1;
                }
            }
            catch_unwind(AssertUnwindSafe(|| loaded.model.forward_batch(&mut items)))
        };
        let secs = started.elapsed().as_secs_f64();
        if rows.0 > 0 {
            self.pace.record(secs, rows.0, rows.1);
        }

        // 3. Each sequence takes its logits back.
        match results {
            Ok(results) => {
                let mut results: Vec<Option<crate::Result<candle_core::Tensor>>> =
                    results.into_iter().map(Some).collect();
                for (i, plan) in plans.iter_mut().enumerate() {
                    let Planned::Run(runs, _) = plan else {
                        continue;
                    };
                    let mine: Vec<(usize, crate::Result<candle_core::Tensor>)> = owners
                        .iter()
                        .enumerate()
                        .filter(|(_, (t, _))| *t == i)
                        .filter_map(|(k, (_, pane))| Some((*pane, results[k].take()?)))
                        .collect();
                    let pool = &mut self.pool;
                    let took = catch_unwind(AssertUnwindSafe(|| {
                        take_logits(&mut self.tasks[i], pool, runs, mine, secs)
                    }));
                    let ended = match took {
                        Ok(ended) => ended.map(|e| (e, false)),
                        Err(panic) => Some((self.tasks[i].failed(&panic_message(&*panic)), true)),
                    };
                    if let Some((e, panicked)) = ended {
                        *plan = Planned::Ended(Box::new(e), panicked);
                    }
                }
            }
            Err(panic) => {
                // The pass itself panicked: every request in it ends, its cache emptied.
                let why = panic_message(&*panic);
                tracing::error!("a batched step panicked: {why}");
                for (plan, task) in plans.iter_mut().zip(&self.tasks) {
                    if matches!(plan, Planned::Run(..)) {
                        *plan = ended(task.failed(&why), true);
                    }
                }
            }
        }

        // 4. Requests that ended leave, the status goes out, then their last events.
        let mut finished = Vec::new();
        for (i, plan) in plans.into_iter().enumerate().rev() {
            if let Planned::Ended(e, panicked) = plan {
                finished.push((self.tasks.remove(i), *e, panicked));
            }
        }
        if finished.is_empty() {
            return;
        }
        for (task, _, panicked) in &finished {
            if let Task::Turn { id, .. } = task {
                self.pool.set_busy(id, false);
                if *panicked {
                    let _ = self.pool.reset(id);
                }
            }
        }
        // Past the pool's bound, idle conversations are forgotten before the status goes out.
        let (_, spill) = self.settings();
        self.pool.trim(spill.as_ref());
        // Status first: a caller acting on the last event sees it current.
        self.publish();
        for (task, e, panicked) in finished.into_iter().rev() {
            task.finish(e, panicked);
        }
    }
}

/// A request's end, as planned.
fn ended(e: Ended, panicked: bool) -> Planned {
    Planned::Ended(Box::new(e), panicked)
}

/// A turn's step error as its last event.
fn turn_error(e: GenerateError) -> Ended {
    Ended::Turn(Some(JobError::from(e).to_event()))
}

/// A comparison's step error as its last event.
fn compare_error(e: GenerateError) -> Ended {
    let e = JobError::from(e);
    Ended::Compare(Event::Error {
        code: e.code,
        message: e.message,
    })
}

/// Hands a request the logits of the rows it ran (`mine`: pane, logits); `Some` when that
/// ended it.
fn take_logits(
    task: &mut Task,
    pool: &mut crate::conversations::Pool,
    runs: &[(usize, Vec<u32>)],
    mine: Vec<(usize, crate::Result<candle_core::Tensor>)>,
    secs: f64,
) -> Option<Ended> {
    match task {
        Task::Turn { id, turn, .. } => {
            let (_, ids) = runs.first()?;
            let Some((_, logits)) = mine.into_iter().next() else {
                return Some(turn_error(GenerateError::Engine(
                    crate::error::EngineError::invalid("the step ran none of the turn's rows"),
                )));
            };
            if logits.is_ok() {
                if let Some(session) = pool.running_session_mut(id) {
                    session.ran(ids);
                }
            }
            // A turn ends in `next`; here only by an error.
            turn.ran(ids, logits.map_err(GenerateError::from), secs)
                .err()
                .map(turn_error)
        }
        Task::Compare { run, .. } => {
            for (pane, logits) in mine {
                let Some((_, ids)) = runs.iter().find(|(p, _)| *p == pane) else {
                    continue;
                };
                if let Err(e) = run.ran(pane, ids, logits.map_err(GenerateError::from), secs) {
                    return Some(compare_error(e));
                }
            }
            None
        }
    }
}
