//! `kvlab serve`: loads a model on the engine thread and serves it over KV Lab's local
//! OpenAI-compatible API (kvlab-server) until Ctrl-C. Loopback only unless `--host` says
//! otherwise, and then only with `--api-key`. Clients' conversations share one KV budget
//! (`--kv-budget`): idle ones are demoted (`--demote-to`), then spilled to `--spill-dir`
//! (within `--disk-budget`), then dropped; on Ctrl-C each goes to its own file, so a restart
//! with the same model picks them up.

use std::net::{IpAddr, SocketAddr};

use clap::Args;
use kvlab_engine::Engine;
use kvlab_server::{
    Limits, ServerConfig, DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_SERVER_MAX_TOKENS,
    DEFAULT_WRITE_TIMEOUT,
};

use crate::model_args::{kv_policy, ModelArgs};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to listen on. Anything beyond loopback requires --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Required from clients as `Authorization: Bearer <key>` (default: `KVLAB_API_KEY`, so
    /// the key need not show in the process list).
    #[arg(long)]
    api_key: Option<String>,
    /// Another host name clients may use in `Host` (repeatable); loopback names always work.
    #[arg(long)]
    allow_host: Vec<String>,
    /// The KV cache requests run with unless they name one (`kv_cache`).
    #[arg(long, default_value = "f16")]
    kv: String,
    /// Tokens of context each request may reach, prompt and answer (the load is checked for
    /// its memory): a longer prompt is refused with `context_overflow` before any work.
    #[arg(long, default_value_t = kvlab_engine::contract::DEFAULT_LOAD_CONTEXT)]
    ctx: usize,
    /// Most tokens an answer may run to: a request's default, and the most it may ask.
    #[arg(long, default_value_t = DEFAULT_SERVER_MAX_TOKENS)]
    max_tokens: usize,
    /// Largest request body, in bytes (an image sent as a data: URL counts in it).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Longest side, in pixels, of an image a request sends (a larger one is refused with
    /// `bad_image` before it is decoded).
    #[arg(long, default_value_t = kvlab_engine::contract::ImageLimits::default().max_side)]
    max_image_side: u32,
    /// Bytes one image may take to decode (`256M`).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    max_image_alloc: u64,
    /// Bytes of request bodies read at once, all connections together (more: `busy`).
    #[arg(long, default_value_t = DEFAULT_MAX_BUFFERED_BYTES)]
    max_buffered_bytes: usize,
    /// Connections open at once (one more is answered 503 and closed).
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Seconds a connection has to send a request's head, and an idle one to send the next.
    #[arg(long, default_value_t = DEFAULT_HEADER_TIMEOUT.as_secs_f64())]
    header_timeout: f64,
    /// Seconds of silence allowed within a request's body (then 408).
    #[arg(long, default_value_t = DEFAULT_BODY_TIMEOUT.as_secs_f64())]
    body_timeout: f64,
    /// Seconds a write may wait for a client that stopped reading (then its connection
    /// closes and its request is cancelled).
    #[arg(long, default_value_t = DEFAULT_WRITE_TIMEOUT.as_secs_f64())]
    write_timeout: f64,
    /// KV bytes all conversations may allocate in memory together (`512M`, `4G`; default: a
    /// quarter of the machine's memory, at most 8 GiB).
    #[arg(long, value_parser = parse_size)]
    kv_budget: Option<u64>,
    /// Bytes the conversations' cache files may take on disk together.
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    disk_budget: u64,
    /// Where idle conversations' caches are spilled (default: a folder of this server's
    /// own, `$KVLAB_CACHE/conversations/<model>-<port>`, so two servers never share one).
    /// Made private (0700); only files the server wrote there are ever removed.
    #[arg(long)]
    spill_dir: Option<std::path::PathBuf>,
    /// Requests that run at once, each in its own conversation, stepped in turn (more wait, up
    /// to 16, then 429).
    #[arg(long, default_value_t = kvlab_engine::contract::MAX_RUNNING, value_parser = parse_parallel)]
    parallel: usize,
    /// Seconds a conversation may stay idle in memory before it is spilled to its file (it
    /// comes back on its next turn); 0: never.
    #[arg(long, default_value_t = kvlab_engine::contract::DEFAULT_IDLE_TTL.as_secs())]
    idle_ttl: u64,
    /// The cache idle conversations are demoted to before they are spilled (default: the
    /// suggested TurboQuant preset).
    #[arg(long)]
    demote_to: Option<String>,
}

/// A size in bytes: a number with an optional `K`, `M`, `G` or `T` (binary units, `B` and
/// `iB` allowed: `512M`, `4GiB`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size (512M, 4G)"))?;
    if !(v.is_finite() && v >= 0.0) || v * (1u64 << shift) as f64 > u64::MAX as f64 {
        return Err(format!("`{s}` is not a size (512M, 4G)"));
    }
    Ok((v * (1u64 << shift) as f64) as u64)
}

/// `--parallel`: 1 to [`kvlab_engine::contract::MAX_PARALLEL`].
fn parse_parallel(s: &str) -> Result<usize, String> {
    let max = kvlab_engine::contract::MAX_PARALLEL;
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("`{s}`: requests at once, 1 to {max}"))
}

/// A timeout flag's seconds as a duration (positive, finite).
fn seconds(s: f64, flag: &str) -> anyhow::Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow::anyhow!("{flag} {s}: a number of seconds above 0"))
}

/// Where spilled conversations go unless `--spill-dir` says: a folder of this server's own,
/// named by its model and port.
fn default_spill_dir(model: &str, port: u16) -> std::path::PathBuf {
    let model: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    conversations_root().join(format!("{}-{port}", model.trim_start_matches('.')))
}

/// The folder the servers' own spill folders are in.
fn conversations_root() -> std::path::PathBuf {
    let cache = std::env::var_os("KVLAB_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/kvlab"))
        })
        .unwrap_or_else(std::env::temp_dir);
    cache.join("conversations")
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = ServerConfig {
        addr: SocketAddr::new(args.host, args.port),
        api_key: args
            .api_key
            .clone()
            .or_else(|| std::env::var("KVLAB_API_KEY").ok())
            .filter(|k| !k.is_empty()),
        allowed_hosts: args.allow_host.clone(),
        max_body_bytes: args.max_body_bytes,
        max_buffered_bytes: args.max_buffered_bytes,
        max_connections: args.max_connections,
        header_timeout: seconds(args.header_timeout, "--header-timeout")?,
        body_timeout: seconds(args.body_timeout, "--body-timeout")?,
        write_timeout: seconds(args.write_timeout, "--write-timeout")?,
        limits: Limits {
            max_tokens: args.max_tokens.max(1),
            context: Some(args.ctx),
            images: kvlab_engine::contract::ImageLimits {
                max_side: args.max_image_side.max(1),
                max_alloc: args.max_image_alloc,
            },
        },
        default_kv: Some(args.kv.clone()),
    }
    .checked()?;
    let engine = Engine::spawn()?;
    let mut pool = engine.pool_settings();
    pool.kv_budget = args.kv_budget;
    pool.disk_budget = args.disk_budget;
    pool.idle_ttl = (args.idle_ttl > 0).then(|| std::time::Duration::from_secs(args.idle_ttl));
    pool.parallel = args.parallel;
    // The default folder names the model and port: set once both are known, before the
    // first request.
    pool.spill_dir = args.spill_dir.clone();
    if let Some(spec) = &args.demote_to {
        pool.demote_to = kv_policy(spec)?;
    }
    engine.set_pool_settings(pool);
    let card = args
        .model
        .load_into(&engine, kv_policy(&args.kv)?, args.ctx)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = kvlab_server::bind(&config).await?;
        let addr = listener.local_addr()?;
        if args.spill_dir.is_none() {
            let mut pool = engine.pool_settings();
            pool.spill_dir = Some(default_spill_dir(&card.name, addr.port()));
            engine.set_pool_settings(pool);
        }
        // One line a script can wait for (tests read the port from it).
        println!("kvlab serve: {} on http://{addr}/v1", card.name);
        kvlab_server::serve(listener, engine.clone(), config, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
        // Each conversation to its own file: a restart on the same model picks them up.
        engine.cancel(None);
        let _ = engine.save_all();
        engine.shutdown();
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn parallel_is_one_to_the_most() {
        assert_eq!(super::parse_parallel("1"), Ok(1));
        assert_eq!(super::parse_parallel("64"), Ok(64));
        for bad in ["0", "65", "-1", "four"] {
            assert!(super::parse_parallel(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_read_as_binary_units() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
