//! The `aether-replicator` binary: parse flags, set up logging, run.

use std::process::ExitCode;

use aether_replicator::app::config::{Cli, Command, LogFormat};
use aether_replicator::etcd::{Client, ClientConfig};

/// The level of the one-shot commands' logs, unless `--log-level` (or its
/// variable) says otherwise: their output is the report, not the log.
const ONE_SHOT_LOG_LEVEL: &str = "warn";
/// `--log-level`'s variable, for the one-shot commands without the flag.
const LOG_LEVEL_VAR: &str = "AETHER_REPLICATOR_LOG_LEVEL";

fn main() -> ExitCode {
    let cli = match Cli::parse_args() {
        Ok(cli) => cli,
        // --help and --version.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprintln!("{}", one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    match &cli.command {
        Some(Command::Completions(args)) => {
            let mut cmd = Cli::command_line();
            clap_complete::generate(
                args.shell,
                &mut cmd,
                "aether-replicator",
                &mut std::io::stdout(),
            );
            return ExitCode::SUCCESS;
        }
        Some(Command::Man) => {
            return match clap_mangen::Man::new(Cli::command_line()).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: writing the man page: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Endpoints(args)) => return endpoints(args),
        Some(Command::Migrate(args)) => return migrate(args),
        Some(Command::Status(args)) => return status(args),
        Some(Command::SetupAuth(args)) => return setup_auth(args),
        Some(Command::Check(_)) | None => {}
    }
    let config = match cli.run_args().validate_run() {
        Ok(c) => c,
        Err(e) => return refused(e),
    };
    if cli.check_config {
        // Validated exactly as a run; nothing connected.
        println!(
            "config ok: region {}, {} peers; effective settings:",
            config.region,
            config.peers.len()
        );
        print!("{}", config.effective());
        return ExitCode::SUCCESS;
    }
    init_logging(config.log_format, &config.log_level);
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    if let Some(Command::Check(_)) = cli.command {
        let result = runtime.block_on(aether_replicator::app::check::run(&config));
        return exit(result, |(report, all_match)| {
            print!("{report}");
            all_match
        });
    }
    exit(
        runtime.block_on(aether_replicator::app::run(config, shutdown_signal())),
        |()| true,
    )
}

/// clap's error text up to its usage block, on one line: "error: ... (see
/// --help)".
fn one_line(text: &str) -> String {
    let mut line = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    line.push_str(" (see --help)");
    line
}

/// Exit 0 when `ok` says so, 1 when it does not or on an error.
fn exit<T, E: std::fmt::Display>(result: Result<T, E>, ok: impl FnOnce(T) -> bool) -> ExitCode {
    match result {
        Ok(v) => {
            if ok(v) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `endpoints`: print the view (and its changes with --watch). Exit 0, 1 on
/// an etcd error, 2 on invalid flags.
fn endpoints(args: &aether_replicator::app::config::EndpointsArgs) -> ExitCode {
    let validated = args.validate().map(|c| (c.local, c.options));
    on_local_etcd(
        validated,
        async |client, options| {
            let mut out = std::io::stdout().lock();
            aether_replicator::app::endpoints::run(client, &options, &mut out, shutdown_signal())
                .await
        },
        |()| true,
    )
}

/// `migrate`: print the report. Exit 0, 1 when --delete-legacy is refused
/// or on an etcd error, 2 on invalid flags.
fn migrate(args: &aether_replicator::app::config::MigrateArgs) -> ExitCode {
    let validated = args.validate().map(|c| (c.local, c.options));
    on_local_etcd(
        validated,
        async |client, options| aether_replicator::app::migrate::migrate(&client, &options).await,
        |report| {
            print!("{}", report.render());
            report.ok()
        },
    )
}

/// The one-shot commands on the local etcd alone (`endpoints`, `migrate`;
/// `status` reads the peers too): the set-up, then `command` with a client
/// of the local etcd and the command's options, then the exit code `ok`
/// makes of its result.
fn on_local_etcd<O, T, E: std::fmt::Display>(
    validated: Result<(ClientConfig, O), E>,
    command: impl AsyncFnOnce(Client, O) -> aether_replicator::error::Result<T>,
    ok: impl FnOnce(T) -> bool,
) -> ExitCode {
    let ((local, options), runtime) = match one_shot(validated, None) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let result = runtime.block_on(async {
        let client = Client::connect(local)?;
        command(client, options).await
    });
    exit(result, ok)
}

/// `status`: print the table or JSON. Exit 0 when healthy, 1 when not or
/// when the local etcd cannot be read, 2 on invalid flags.
fn status(args: &aether_replicator::app::config::StatusArgs) -> ExitCode {
    use aether_replicator::app::status::{self, StatusOutput};
    let level = args.run.settings.log_level.as_deref();
    let ((config, options), runtime) = match one_shot(args.validate(), level) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let result = runtime.block_on(status::run(&config, &options));
    exit(result, |report| {
        match args.output {
            StatusOutput::Table => print!("{}", report.render_table()),
            StatusOutput::Json => println!("{}", report.to_json()),
        }
        report.healthy()
    })
}

/// `setup-auth`: print the etcdctl commands, or with `--apply` make every
/// etcd match the plan and print what changed. Exit 0, 1 on an etcd error
/// (after the etcds before it are done), 2 on invalid flags.
fn setup_auth(args: &aether_replicator::app::config::SetupAuthArgs) -> ExitCode {
    use aether_replicator::app::setup_auth;
    let level = args.run.settings.log_level.as_deref();
    let (config, runtime) = match one_shot(args.validate(), level) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let Some(targets) = config.apply else {
        print!("{}", setup_auth::render(&config.region, &config.plans));
        return ExitCode::SUCCESS;
    };
    let result = runtime.block_on(async {
        for (plan, (admin, user)) in config.plans.iter().zip(targets) {
            let which = match plan.name.as_str() {
                "local" => format!("region {}'s own etcd", config.region),
                peer => format!("peer {peer}'s etcd"),
            };
            let applied = async {
                let client = Client::connect(admin)?;
                setup_auth::apply(&client, plan, &user.password).await
            }
            .await
            .map_err(|e| format!("{which}: {e}"))?;
            if applied.changes.is_empty() {
                println!("{which}: user {} up to date", plan.user);
            }
            for change in &applied.changes {
                println!("{which}: {change}");
            }
            for note in &applied.notes {
                println!("{which}: note: {note}");
            }
        }
        Ok::<_, String>(())
    });
    exit(result, |()| true)
}

/// The set-up of the one-shot commands (`endpoints`, `migrate`, `status`): refuse
/// invalid flags, log at `level` (`--log-level`, for the commands that have
/// it), else its variable's, else warnings only, and start a runtime.
fn one_shot<C, E: std::fmt::Display>(
    validated: Result<C, E>,
    level: Option<&str>,
) -> Result<(C, tokio::runtime::Runtime), ExitCode> {
    let config = validated.map_err(refused)?;
    let level = level
        .map(str::to_string)
        .or_else(|| std::env::var(LOG_LEVEL_VAR).ok())
        .unwrap_or_else(|| ONE_SHOT_LOG_LEVEL.to_string());
    init_logging(LogFormat::Text, &level);
    let runtime = runtime().ok_or(ExitCode::FAILURE)?;
    Ok((config, runtime))
}

/// Invalid flags: one line naming the flag, exit code 2.
fn refused(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            None
        }
    }
}

/// Logs go to stderr, filtered by `level` (`--log-level`'s form).
fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::new(level);
    // Colours only for a person at a terminal: a log collector stores the
    // escape codes verbatim, and `NO_COLOR` (no-color.org) turns them off.
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        // The event's fields, `message` among them, at the top level of the
        // object, as log collectors look for them; the span the event is in,
        // but not the list of every span around it, which repeated it.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_span_list(false)
            .init(),
        LogFormat::Text => builder.init(),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested");
}
