//! The `inboxd` binary: parse the command line, set up logging, run the
//! command, and turn its result into an exit code (2: bad usage or config,
//! 1: failure, 0: success).

use clap::Parser;
use inboxd::cli::{Cli, CliError, Command, authoring, demo, dlq, outbox, purge, remote, run, status};

fn main() {
    // A compile worker (`inboxd` run by itself to compile a component under
    // limits) does only that, and exits.
    inboxd::wasm::compile_worker::serve_if_asked();
    // SAFETY: no other thread exists yet; the runtime starts below.
    unsafe { inboxd::telemetry::library_backtraces_off_unless_asked() };
    start();
}

#[tokio::main]
async fn start() {
    let cli = Cli::parse();
    let default_log = match cli.command {
        Command::Demo(_) => "warn,inboxd=info",
        // Their report is the output; the host's own info lines would bury it.
        Command::Check(_) | Command::Test(_) | Command::Build(_) => "error",
        // sqlx reports PostgreSQL's "already exists, skipping" notices at info.
        _ => "info,sqlx::postgres::notice=warn",
    };
    // `inboxd run` exports spans if its config file says where; the file is
    // read again, and any error in it reported, by the command itself.
    let config = match &cli.command {
        Command::Run { config } => inboxd::config::Config::load(config).ok(),
        _ => None,
    };
    let otlp = config.as_ref().and_then(|c| {
        c.telemetry
            .otlp_endpoint
            .as_deref()
            .map(|endpoint| inboxd::telemetry::OtlpTarget {
                endpoint,
                service: &c.telemetry.service_name,
            })
    });
    let traces = match inboxd::telemetry::init(default_log, cli.log_format, otlp) {
        Ok(traces) => traces,
        Err(error) => {
            eprintln!("inboxd: {error}");
            std::process::exit(2);
        }
    };
    let result: Result<(), CliError> = match cli.command {
        Command::Run { config } => run::run(&config).await,
        Command::Migrate { config } => run::migrate(&config).await,
        Command::Dlq(args) => dlq::dlq(args).await,
        Command::Outbox(args) => outbox::run(args).await,
        Command::Status(args) => status::status(args).await,
        Command::Purge(args) => purge::purge(args).await,
        Command::Demo(args) => demo::demo(args).await,
        Command::New(args) => authoring::new::new(args),
        Command::Build(args) => authoring::build::build(args).await,
        Command::Check(args) => authoring::check::check(args).await,
        Command::Test(args) => authoring::run_events::test(args).await,
        Command::Deploy(args) => remote::deploy(args).await,
        Command::Handlers(args) => remote::handlers(args).await,
        Command::Activate(args) => remote::activate(args).await,
        Command::Rollback(args) => remote::action("rollback", args).await,
        Command::Pause(args) => remote::action("pause", args).await,
        Command::Resume(args) => remote::action("resume", args).await,
        Command::Delete(args) => remote::action("delete", args).await,
    };
    // The spans of the last batches, before the process ends.
    if let Some(traces) = traces {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    if let Err(error) = result {
        eprintln!("inboxd: {error}");
        std::process::exit(error.exit_code());
    }
}
