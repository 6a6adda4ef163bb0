//! `kvlab serve`: loads a model on the engine thread and serves it over KV Lab's local
//! OpenAI-compatible API (kvlab-server) until Ctrl-C. Loopback only unless `--host` says
//! otherwise, and then only with `--api-key`.

use std::net::{IpAddr, SocketAddr};

use clap::Args;
use kvlab_engine::Engine;
use kvlab_server::{ServerConfig, DEFAULT_MAX_BODY_BYTES};

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
    /// Tokens of context the load is checked for (memory).
    #[arg(long, default_value_t = kvlab_engine::worker::DEFAULT_LOAD_CONTEXT)]
    ctx: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
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
        default_kv: Some(args.kv.clone()),
    }
    .checked()?;
    let engine = Engine::spawn()?;
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
        // One line a script can wait for (tests read the port from it).
        println!("kvlab serve: {} on http://{addr}/v1", card.name);
        kvlab_server::serve(listener, engine.clone(), config, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
        engine.shutdown();
        anyhow::Ok(())
    })
}
