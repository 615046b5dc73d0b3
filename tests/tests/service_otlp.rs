//! Tracing export: `ferry serve` with OTEL_EXPORTER_OTLP_ENDPOINT sends its spans (one
//! per job, sampled endpoint operations) to an OTLP/gRPC trace collector this test runs,
//! and JSON logs when asked.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use ferry_tests::service_support::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");

/// The spans received: (name, attributes as key=value strings, resource attributes).
type Received = Arc<Mutex<Vec<(String, Vec<String>, Vec<String>)>>>;

#[derive(Debug, Clone, Default)]
struct Collector {
    spans: Received,
}

fn kv(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> Vec<String> {
    attrs
        .iter()
        .map(|a| {
            let v = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            format!("{}={v}", a.key)
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock();
        for rs in &request.get_ref().resource_spans {
            let resource = rs
                .resource
                .as_ref()
                .map(|r| kv(&r.attributes))
                .unwrap_or_default();
            for ss in &rs.scope_spans {
                for span in &ss.spans {
                    spans.push((span.name.clone(), kv(&span.attributes), resource.clone()));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp_addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(collector.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let receiver = tokio::spawn(server);

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let args = vec![
        "--data-dir".to_string(),
        tmp.path().join("data").display().to_string(),
        "--allow-root".to_string(),
        root.display().to_string(),
        "--log-format".to_string(),
        "json".to_string(),
    ];
    let endpoint = format!("http://{otlp_addr}");
    let serve = ServeProcess::start(
        Path::new(BIN),
        &args,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "ferry-under-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    let mut client = connect(serve.grpc).await;
    let src = make_image(&root.join("src.img"), 4 * 1024 * 1024, 1);
    let job = client
        .start_transfer(transfer(&src, &root.join("dst.img")))
        .await
        .unwrap()
        .into_inner();
    let done = wait_terminal(&mut client, &job.id, Duration::from_secs(60)).await;
    assert_eq!(state(&done), JobState::Succeeded);
    let (status, _, log) = serve.terminate(Duration::from_secs(20));
    assert!(status.success(), "{log}");
    // JSON logs: every line of stderr is a JSON object.
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        assert!(v.get("level").is_some(), "{line}");
    }

    let spans = collector.spans.lock().clone();
    receiver.abort();
    let job_span = spans
        .iter()
        .find(|(name, attrs, _)| name == "job" && attrs.contains(&format!("job.id={}", job.id)))
        .unwrap_or_else(|| panic!("no job span among {spans:?}"));
    assert!(
        job_span.1.contains(&"job.kind=transfer".to_string()),
        "{job_span:?}"
    );
    assert!(
        job_span
            .2
            .contains(&"service.name=ferry-under-test".to_string()),
        "{job_span:?}"
    );
    assert!(
        spans
            .iter()
            .any(|(name, attrs, _)| name == "endpoint"
                && attrs.contains(&"endpoint=file".to_string())),
        "no sampled endpoint span among {spans:?}"
    );
}
