//! The Kubernetes manifests in `deploy/kubernetes/`, rendered with `kubectl kustomize` as a
//! platform team would apply them, checked against the binary and the image: the ConfigMap's
//! config passes `agent-gateway check-config` and holds no agent (nothing shipped accepts a
//! known token), the probes, ports and paths are the ones a gateway running that config
//! answers on, the image, its user and its config path are the Containerfile's, every object
//! has the recommended labels, the NetworkPolicy opens only the proxy port to all, the
//! PrometheusRule carries `config/prometheus/alerts.yml` (and passes promtool), the dashboard
//! ConfigMap carries `config/grafana/agent-gateway.json`, the example-agents overlay keeps its
//! agents in a mounted Secret and cannot run until its placeholder digests (the agent's, the
//! admin token's) are replaced, the Redis overlay is the base plus a shared rate limit that
//! works, and in the base and every overlay, the files of each Secret or ConfigMap a pod mounts
//! are readable by the group its containers run as (the pod's `fsGroup`) and no one else.
//!
//! kustomize reads only files under a kustomization's root, so four files there are copies
//! made from their sources by this test. When a source changes, regenerate them with
//! `UPDATE_KUBERNETES=1 cargo test --test kubernetes` (then commit the result).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use agent_gateway::config::file::AgentFile;
use agent_gateway::config::{FileConfig, OnRedisError, RateLimitBackend};
use serde::Deserialize;
use serde_json::Value;

use common::redis::{RedisServer, REDIS_TIMEOUT_MS};
use common::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BASE: &str = "deploy/kubernetes/base";
const REDIS_OVERLAY: &str = "deploy/kubernetes/overlays/redis";
const EXAMPLE_OVERLAY: &str = "deploy/kubernetes/overlays/example-agents";
/// Where the overlays are, each a directory with its kustomization.yaml.
const OVERLAYS: &str = "deploy/kubernetes/overlays";
const CONTAINERFILE: &str = "Containerfile";
const ALERTS: &str = "config/prometheus/alerts.yml";
const DASHBOARD_SOURCE: &str = "config/grafana/agent-gateway.json";
/// The key (file name) of the gateway's config in its ConfigMap.
const CONFIG_KEY: &str = "gateway.toml";
/// The recommended labels every object carries, and their values (`None`: any, not empty).
fn recommended_labels() -> [(&'static str, Option<&'static str>); 5] {
    [
        ("app.kubernetes.io/name", Some("agent-gateway")),
        ("app.kubernetes.io/part-of", Some("agent-gateway")),
        ("app.kubernetes.io/managed-by", Some("kustomize")),
        ("app.kubernetes.io/version", Some(env!("CARGO_PKG_VERSION"))),
        ("app.kubernetes.io/component", None),
    ]
}

fn path(relative: &str) -> PathBuf {
    Path::new(ROOT).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(path(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The generated copies
// ---------------------------------------------------------------------------------------------

/// What the Redis overlay appends to the base's config.
const REDIS_SECTION: &str = r#"
# Added by the Redis overlay: the per-agent limits are kept in the Redis of redis.yaml, shared
# by every replica. While it does not answer within timeout_ms, each replica uses its own
# buckets (on_redis_error = "local") and counts agent_gateway_rate_limit_backend_errors_total.
# Its password is in the Secret agent-gateway-redis-auth (redis-auth/password in the overlay),
# mounted at /etc/agent-gateway-redis and watched like this file.
[rate_limit]
backend = "redis"
redis_url = "redis://agent-gateway-redis:6379/0"
redis_password_file = "/etc/agent-gateway-redis/password"
on_redis_error = "local"
timeout_ms = 50
key_prefix = "agent-gateway:"
"#;

/// What the example-agents overlay appends to the base's config: its agents in the Secret it
/// mounts, and an admin token whose digest is a placeholder the gateway refuses.
const EXAMPLE_AGENTS_SECTION: &str = r#"
# Added by the example-agents overlay: the agents are in the Secret agent-gateway-agents
# (agents.toml in the overlay), mounted at /etc/agent-gateway-secrets and watched like this
# file.
[auth]
agents_file = "/etc/agent-gateway-secrets/agents.toml"

# Every admin endpoint but the probes and /metrics needs this token (Authorization: Bearer;
# a browser opening the board asks for a password: this token).
# The token_sha256 below is a placeholder the gateway refuses: replace it with the output of
#   printf '%s' "$ADMIN_TOKEN" | agent-gateway hash-token
[admin]
token_sha256 = "REPLACE-with-the-output-of-agent-gateway-hash-token"
"#;

/// Each generated file (relative path) and the text it must hold.
fn generated() -> Vec<(String, String)> {
    let alerts = read(ALERTS);
    let indented: String = alerts
        .lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    let rule = format!(
        "# Generated from {ALERTS} by tests/kubernetes.rs; do not edit. Regenerate with\n\
         # UPDATE_KUBERNETES=1 cargo test --test kubernetes\n\
         # Your Prometheus' ruleSelector may want a label here (kube-prometheus-stack: release).\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n\
         \x20 name: agent-gateway\n\
         \x20 labels:\n\
         \x20   app.kubernetes.io/component: monitoring\n\
         spec:\n\
         {indented}"
    );
    vec![
        (format!("{BASE}/prometheusrule.yaml"), rule),
        (
            format!("{BASE}/agent-gateway-dashboard.json"),
            read(DASHBOARD_SOURCE),
        ),
        (
            format!("{REDIS_OVERLAY}/{CONFIG_KEY}"),
            read(&format!("{BASE}/{CONFIG_KEY}")) + REDIS_SECTION,
        ),
        (
            format!("{EXAMPLE_OVERLAY}/{CONFIG_KEY}"),
            read(&format!("{BASE}/{CONFIG_KEY}")) + EXAMPLE_AGENTS_SECTION,
        ),
    ]
}

#[test]
fn the_copies_kustomize_needs_equal_their_sources() {
    let update = std::env::var_os("UPDATE_KUBERNETES").is_some();
    let mut stale = Vec::new();
    for (file, want) in generated() {
        if std::fs::read_to_string(path(&file)).ok().as_deref() == Some(want.as_str()) {
            continue;
        }
        if update {
            std::fs::write(path(&file), want).unwrap();
        } else {
            stale.push(file);
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} differ from their sources; regenerate with \
         `UPDATE_KUBERNETES=1 cargo test --test kubernetes`"
    );
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

/// The objects `kubectl kustomize dir` renders, as JSON values.
fn kustomize(dir: &str) -> Vec<Value> {
    let out = Command::new(which("kubectl"))
        .args(["kustomize", &path(dir).display().to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} (needs kubectl 1.22 or later: kustomize v4.1+, for `labels`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .collect()
}

/// The one object of `kind` named `name`.
fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name}");
    found[0]
}

/// Whether `selector` (a matchLabels map) selects an object with `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_object().expect("a label map");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels[k] == *v)
}

/// The rendered gateway config: the ConfigMap's file, and its parse.
fn configmap_config(objects: &[Value]) -> (String, FileConfig) {
    let text = object(objects, "ConfigMap", "agent-gateway-config")["data"][CONFIG_KEY]
        .as_str()
        .expect("the config is in the ConfigMap")
        .to_string();
    let parsed = FileConfig::parse(&text).unwrap();
    (text, parsed)
}

/// `agent-gateway check-config --no-resolve` on `text` (the ConfigMap names its backend by a
/// Service name, which resolves only in the cluster): its output.
fn check_config(text: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(CONFIG_KEY);
    std::fs::write(&file, text).unwrap();
    cli([
        "check-config".as_ref(),
        "--no-resolve".as_ref(),
        "--config".as_ref(),
        file.as_os_str(),
    ])
}

/// [`check_config`], which must pass; what it wrote to stderr (its warnings).
fn check_config_passes(text: &str) -> String {
    let out = check_config(text);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "check-config refused the ConfigMap's config: {stderr}"
    );
    stderr
}

/// `check-config --no-resolve` on the overlay's config in `dir`, as an operator runs it there
/// before applying: the files it names under each Secret's mount (the first of a pair) read
/// from the overlay's files (the second).
fn check_overlay(dir: &Path, mounts: &[(&str, &Path)]) -> std::process::Output {
    let mut args = vec![
        "check-config".to_string(),
        "--no-resolve".into(),
        "--config".into(),
        dir.join(CONFIG_KEY).display().to_string(),
    ];
    for (mounted, local) in mounts {
        args.push("--mount".into());
        args.push(format!("{mounted}={}", local.display()));
    }
    cli(args)
}

/// The value of the Containerfile's instruction `name` (`USER`, `CMD`) in its last stage.
fn containerfile(name: &str) -> String {
    let text = read(CONTAINERFILE);
    let prefix = format!("{name} ");
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in the Containerfile"))
        .to_string()
}

/// Every object of the base is among an overlay's `objects`, unchanged but for the config.
fn assert_base_objects_unchanged(base: &[Value], objects: &[Value], changed: &[&str]) {
    for o in base {
        let name = o["metadata"]["name"].as_str().unwrap();
        let kind = o["kind"].as_str().unwrap();
        if name != "agent-gateway-config" && !changed.contains(&kind) {
            assert_eq!(object(objects, kind, name), o);
        }
    }
}

/// Every rendered object carries the recommended labels.
fn assert_recommended_labels(objects: &[Value]) {
    for o in objects {
        let labels = &o["metadata"]["labels"];
        for (key, want) in recommended_labels() {
            let got = labels[key].as_str().unwrap_or_default();
            match want {
                Some(want) => assert_eq!(
                    got, want,
                    "{key} of {} {}",
                    o["kind"], o["metadata"]["name"]
                ),
                None => assert!(
                    !got.is_empty(),
                    "no {key} on {} {}",
                    o["kind"],
                    o["metadata"]["name"]
                ),
            }
        }
    }
}

fn port_of(address: &str) -> u64 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// The gateway container of the Deployment.
fn gateway_container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1);
    &containers[0]
}

/// The container port named `name`.
fn container_port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
        .as_u64()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// The base
// ---------------------------------------------------------------------------------------------

#[test]
fn the_base_renders_every_object_and_each_agrees_with_the_gateway_and_the_others() {
    let objects = kustomize(BASE);
    let mut kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "PrometheusRule",
            "Service",
            "Service",
            "ServiceMonitor"
        ]
    );
    assert_recommended_labels(&objects);
    let (text, cfg) = configmap_config(&objects);
    // No agent ships: every call is refused until the user adds theirs, and check-config says
    // so without failing.
    assert!(cfg.auth.agents.is_empty());
    let warnings = check_config_passes(&text);
    assert!(warnings.contains("no agent is configured"), "{warnings}");

    let deployment = object(&objects, "Deployment", "agent-gateway");
    let pod = &deployment["spec"]["template"];
    let pod_labels = &pod["metadata"]["labels"];
    assert!(selects(
        &deployment["spec"]["selector"]["matchLabels"],
        pod_labels
    ));
    // The HorizontalPodAutoscaler owns the replicas: an apply must not reset them.
    assert!(deployment["spec"].get("replicas").is_none());
    let c = gateway_container(deployment);

    // The image `cargo xtask image` tags, run by its own entrypoint as its own user.
    assert_eq!(
        c["image"],
        format!("agent-gateway:{}", env!("CARGO_PKG_VERSION"))
    );
    assert!(c.get("command").is_none(), "the image's entrypoint runs");
    let image_user = containerfile("USER");
    let (uid, gid) = image_user.split_once(':').unwrap();
    assert_eq!(pod["spec"]["securityContext"]["runAsUser"].to_string(), uid);
    assert_eq!(
        pod["spec"]["securityContext"]["runAsGroup"].to_string(),
        gid
    );

    // The container runs the ConfigMap's file, mounted as a directory (a subPath mount would
    // never see an update).
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[..2], ["run", "--config"]);
    let image_cmd: Vec<String> = serde_json::from_str(&containerfile("CMD")).unwrap();
    assert_eq!(args, image_cmd, "the image's own CMD");
    let config_path = Path::new(args[2]);
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    let mount_of = |volume: &str| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume)
            .unwrap_or_else(|| panic!("volume {volume} is not mounted"))
    };
    let config_volume = volumes
        .iter()
        .find(|v| v["configMap"]["name"] == "agent-gateway-config")
        .expect("a volume of the config ConfigMap");
    let config_mount = mount_of(config_volume["name"].as_str().unwrap());
    assert_eq!(
        config_path.parent().unwrap(),
        Path::new(config_mount["mountPath"].as_str().unwrap())
    );
    assert!(config_mount.get("subPath").is_none());
    assert_eq!(config_path.file_name().unwrap(), CONFIG_KEY);

    // Ports and probes are the config's listeners, on every interface of the pod.
    assert!(cfg.listen.proxy.starts_with("0.0.0.0:"));
    let admin = cfg.listen.admin.as_deref().expect("an admin listener");
    assert!(admin.starts_with("0.0.0.0:"));
    assert_eq!(container_port(c, "http"), port_of(&cfg.listen.proxy));
    assert_eq!(container_port(c, "admin"), port_of(admin));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin");

    // Shutdown: the preStop pause, then the gateway's own drain, fit in the grace period.
    let pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .unwrap();
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(
        grace > pre_stop + cfg.server.grace_period_seconds,
        "terminationGracePeriodSeconds {grace} must exceed preStop {pre_stop} s + \
         server.grace_period_seconds {}",
        cfg.server.grace_period_seconds
    );

    // Non-root on a read-only root filesystem. The upgrade socket is on no emptyDir: the
    // kubelet makes one writable by every user (0777), which the gateway refuses for it. A pod
    // is replaced by a rollout, never upgraded in place: the default socket's directory, which
    // the image does not have, under a root-owned one, passes and is never waited on.
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_ne!(pod["spec"]["securityContext"]["runAsUser"], 0);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    let sock_dir = Path::new(&cfg.server.upgrade_sock).parent().unwrap();
    for v in volumes.iter().filter(|v| v.get("emptyDir").is_some()) {
        let at = mount_of(v["name"].as_str().unwrap())["mountPath"]
            .as_str()
            .unwrap();
        assert!(
            !sock_dir.starts_with(at),
            "{} is on the emptyDir at {at}",
            sock_dir.display()
        );
    }
    for resource in ["cpu", "memory"] {
        assert!(
            c["resources"]["requests"][resource].is_string(),
            "{resource} request"
        );
    }

    // The Services reach the pods' named ports; clients' Service has no admin port.
    let proxy_service = object(&objects, "Service", "agent-gateway");
    let admin_service = object(&objects, "Service", "agent-gateway-admin");
    for (service, port) in [(proxy_service, "http"), (admin_service, "admin")] {
        assert!(selects(&service["spec"]["selector"], pod_labels));
        let ports = service["spec"]["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0]["targetPort"], port);
    }

    let pdb = object(&objects, "PodDisruptionBudget", "agent-gateway");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], pod_labels));
    // With every pod unready (a crash loop), a drain may still evict them.
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    let hpa = object(&objects, "HorizontalPodAutoscaler", "agent-gateway");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "agent-gateway");
    assert!(hpa["spec"]["minReplicas"].as_u64().unwrap() >= 2);

    // The ServiceMonitor scrapes the admin Service only, as the job the alerts select.
    let monitor = object(&objects, "ServiceMonitor", "agent-gateway");
    let wanted = &monitor["spec"]["selector"]["matchLabels"];
    assert!(selects(wanted, &admin_service["metadata"]["labels"]));
    assert!(!selects(wanted, &proxy_service["metadata"]["labels"]));
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], admin_service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["path"], "/metrics");
    let job_label = monitor["spec"]["jobLabel"].as_str().unwrap();
    let job = admin_service["metadata"]["labels"][job_label]
        .as_str()
        .unwrap();
    let alerts = read(ALERTS);
    let jobs: Vec<&str> = alerts
        .split("job=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        .collect();
    assert!(!jobs.is_empty());
    assert!(
        jobs.iter().all(|j| *j == job),
        "alerts select {jobs:?}, scraped as {job}"
    );

    // The dashboard, as Grafana's sidecar finds it.
    let dashboard = object(&objects, "ConfigMap", "agent-gateway-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let data = dashboard["data"].as_object().unwrap();
    assert_eq!(data.len(), 1);
    let carried: Value =
        serde_json::from_str(data.values().next().unwrap().as_str().unwrap()).unwrap();
    let source: Value = serde_json::from_str(&read(DASHBOARD_SOURCE)).unwrap();
    assert_eq!(carried, source);
}

#[test]
fn the_prometheus_rule_carries_the_shipped_alerts_and_promtool_accepts_them() {
    let objects = kustomize(BASE);
    let rule = object(&objects, "PrometheusRule", "agent-gateway");
    let shipped: Value = serde_norway::from_str(&read(ALERTS)).unwrap();
    assert_eq!(rule["spec"], shipped);
    assert!(!shipped["groups"][0]["rules"].as_array().unwrap().is_empty());
    // promtool reads the rule's spec as a rule file (JSON is YAML).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yml");
    std::fs::write(&file, rule["spec"].to_string()).unwrap();
    let out = Command::new(which("promtool"))
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cfg` made runnable here by typed edits only: listeners on loopback ports the harness
/// chooses, the backend `upstream`, the upgrade socket in `dir`.
fn runnable_here(mut cfg: FileConfig, upstream: std::net::SocketAddr, dir: &Path) -> FileConfig {
    cfg.listen.proxy = ANY_PORT.into();
    cfg.listen.admin = Some(ANY_PORT.into());
    cfg.upstream.addresses = vec![upstream.to_string()];
    cfg.server.upgrade_sock = dir.join("upgrade.sock").display().to_string();
    cfg
}

/// The rendered probes, each as (path, port name).
fn probes(objects: &[Value]) -> Vec<(String, String)> {
    let c = gateway_container(object(objects, "Deployment", "agent-gateway"));
    ["livenessProbe", "readinessProbe"]
        .iter()
        .map(|p| {
            let get = &c[*p]["httpGet"];
            (
                get["path"].as_str().unwrap().to_string(),
                get["port"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Starts the rendered config here and checks that each probe answers 200 on the listener its
/// port names.
fn run_and_probe(objects: &[Value], cfg: FileConfig) -> (Gateway, Backend) {
    let backend = Backend::start();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::builder(runnable_here(cfg, backend.addr, dir.path())).start();
    let ports = BTreeMap::from([("admin", gw.admin), ("http", gw.proxy)]);
    for (probe_path, port) in probes(objects) {
        let addr = ports[port.as_str()];
        gw.wait_until(&format!("{probe_path} on {port} to answer 200"), || {
            request(addr, "GET", &probe_path, &[], b"").status == 200
        });
    }
    (gw, backend)
}

/// The status of a v2 status call through `gw` by agent `id` with `token`.
fn call_as(gw: &Gateway, id: &str, token: &str) -> u16 {
    let answer = request(
        gw.proxy,
        "GET",
        "/api/v2/transaction/tx-1/status",
        &[("X-Service-Agent-Id", id), ("X-Auth-Token", token)],
        b"",
    );
    answer.status
}

/// An agent a user adds, with a token of its own and a rate limit.
fn users_agent(token: &str) -> AgentFile {
    AgentFile {
        rate_limit_per_second: Some(50.0),
        burst: Some(100),
        ..AgentFile::new("team-agent", token)
    }
}

#[test]
fn the_probes_answer_on_a_gateway_running_the_configmaps_config_which_lets_no_one_in() {
    let objects = kustomize(BASE);
    let (_, cfg) = configmap_config(&objects);
    let (gw, _backend) = run_and_probe(&objects, cfg);
    // The README's demo token, and any other, are refused: the base has no agent.
    assert_eq!(call_as(&gw, "example-agent", "demo-token"), 401);
    assert_eq!(call_as(&gw, "demo-agent", "demo-token"), 401);
}

#[test]
fn the_network_policy_lets_anyone_reach_the_proxy_port_and_only_monitoring_the_admin_port() {
    let objects = kustomize(BASE);
    let policy = object(&objects, "NetworkPolicy", "agent-gateway");
    let gateway_pod = &object(&objects, "Deployment", "agent-gateway")["spec"]["template"];
    assert!(selects(
        &policy["spec"]["podSelector"]["matchLabels"],
        &gateway_pod["metadata"]["labels"]
    ));
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    let rule_for = |port: &str| {
        let found: Vec<&Value> = rules
            .iter()
            .filter(|r| {
                r["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["port"] == port)
            })
            .collect();
        assert_eq!(found.len(), 1, "one rule opens {port}");
        assert_eq!(
            found[0]["ports"].as_array().unwrap().len(),
            1,
            "{port} alone"
        );
        found[0]
    };
    // The named ports are the container's: a rule on a name the pod lacks would open nothing.
    let c = gateway_container(object(&objects, "Deployment", "agent-gateway"));
    container_port(c, "http");
    container_port(c, "admin");
    assert!(rule_for("http").get("from").is_none(), "from anywhere");
    let from = rule_for("admin")["from"].as_array().unwrap();
    assert_eq!(
        from,
        &[
            serde_json::json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}})
        ]
    );
    assert_eq!(rules.len(), 2, "no other way in: {rules:?}");
}

// ---------------------------------------------------------------------------------------------
// The example-agents overlay
// ---------------------------------------------------------------------------------------------

/// The agents file of the overlay's Secret, as the pods read it.
fn secret_agents(objects: &[Value]) -> String {
    use base64::Engine;
    let data = object(objects, "Secret", "agent-gateway-agents")["data"]["agents.toml"]
        .as_str()
        .expect("the agents are in the Secret")
        .replace('\n', "");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

/// `cfg` with its agents file at `dir`/agents.toml holding `agents`, as the pod's mount has it.
fn with_agents_here(mut cfg: FileConfig, agents: &str, dir: &Path) -> FileConfig {
    let file = dir.join("agents.toml");
    std::fs::write(&file, agents).unwrap();
    cfg.auth.agents_file = Some(file.display().to_string());
    cfg
}

#[test]
fn the_example_agents_overlay_runs_only_once_its_placeholders_are_replaced_by_digests() {
    let base = kustomize(BASE);
    let objects = kustomize(EXAMPLE_OVERLAY);
    assert_recommended_labels(&objects);
    let (_, cfg) = configmap_config(&objects);
    let agents = secret_agents(&objects);
    // The Secret is mounted where the config's agents_file is, as a directory of its own.
    let file = PathBuf::from(cfg.auth.agents_file.clone().unwrap());
    let c = gateway_container(object(&objects, "Deployment", "agent-gateway"));
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "agents")
        .expect("the agents' Secret is mounted");
    assert_eq!(
        mount["mountPath"],
        file.parent().unwrap().display().to_string()
    );
    assert!(mount.get("subPath").is_none());
    let pod = &object(&objects, "Deployment", "agent-gateway")["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "agents")
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "agent-gateway-agents");
    // No agent in the ConfigMap: they are all in the Secret.
    assert!(cfg.auth.agents.is_empty());

    // As shipped, it is refused, checked as its kustomization's comment says: both
    // placeholders are no digest, so no token gets in.
    let overlay = path(EXAMPLE_OVERLAY);
    let mounted = file.parent().unwrap().to_str().unwrap();
    let out = check_overlay(&overlay, &[(mounted, &overlay)]);
    assert!(!out.status.success());
    let problems = String::from_utf8_lossy(&out.stderr);
    for key in ["agents[0].token_sha256", "admin.token_sha256"] {
        assert!(problems.contains(key), "{key}: {problems}");
    }
    assert!(!problems.contains("cannot read"), "{problems}");
    // It is the base's config plus the agents file and the admin token.
    let (_, base_cfg) = configmap_config(&base);
    let mut expected = base_cfg.clone();
    expected.auth.agents_file = cfg.auth.agents_file.clone();
    expected.admin = cfg.admin.clone();
    assert_eq!(cfg.to_toml(), expected.to_toml());
    assert_base_objects_unchanged(&base, &objects, &["Deployment"]);

    // A copy of the overlay with digests of the user's tokens in their places passes the same
    // check, with no warning.
    let placeholder = "REPLACE-with-the-output-of-agent-gateway-hash-token";
    let digest = |t: &str| AgentFile::new("", t).token_sha256.0[0].clone();
    let copy = tempfile::tempdir().unwrap();
    for (name, token) in [
        (CONFIG_KEY, "their-admin-token"),
        ("agents.toml", "their-own-token"),
    ] {
        let text = read(&format!("{EXAMPLE_OVERLAY}/{name}"));
        std::fs::write(
            copy.path().join(name),
            text.replace(placeholder, &digest(token)),
        )
        .unwrap();
    }
    let out = check_overlay(copy.path(), &[(mounted, copy.path())]);
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && warnings.is_empty(), "{warnings}");

    // Run so, that agent, and only it, gets in, and only the admin token opens /config.
    let dir = tempfile::tempdir().unwrap();
    let agents = agents.replace(placeholder, &digest("their-own-token"));
    let mut filled = with_agents_here(cfg.clone(), &agents, dir.path());
    filled.admin.token_sha256.0 = vec![digest("their-admin-token")];
    let (gw, _backend) = run_and_probe(&objects, filled);
    assert_eq!(call_as(&gw, "example-agent", "their-own-token"), 200);
    assert_eq!(call_as(&gw, "example-agent", "demo-token"), 401);
    assert_eq!(admin_get(gw.admin, "/config").status, 401);
    let admin = [("Authorization", "Bearer their-admin-token")];
    assert_eq!(request(gw.admin, "GET", "/config", &admin, b"").status, 200);
    gw.wait_for_metric(
        "agent_gateway_rate_limit_decisions_total{backend=\"local\",result=\"allowed\"}",
        1.0,
    );
}

// ---------------------------------------------------------------------------------------------
// The Redis overlay
// ---------------------------------------------------------------------------------------------

/// Where the overlay mounts its Secret `name` in `deployment`'s first container: a directory
/// of its own (not a subPath), so that the kubelet swaps it in place.
fn secret_mount(objects: &[Value], deployment: &str, name: &str) -> PathBuf {
    let pod = &object(objects, "Deployment", deployment)["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == name)
        .unwrap_or_else(|| panic!("{deployment} has no volume of the Secret {name}"));
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .unwrap_or_else(|| panic!("{deployment} does not mount the Secret {name}"));
    assert!(mount.get("subPath").is_none());
    PathBuf::from(mount["mountPath"].as_str().unwrap())
}

/// The value of `key` in the Secret `name`, as the pods read it.
fn secret_value(objects: &[Value], name: &str, key: &str) -> String {
    use base64::Engine;
    let data = object(objects, "Secret", name)["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in the Secret {name}"))
        .replace('\n', "");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

/// The Redis container's command and arguments, with the Secret it reads its password from
/// mounted at `local` rather than where the pod mounts it (`mounted`).
fn redis_command(objects: &[Value], mounted: &Path, local: &Path) -> Vec<String> {
    let container = &object(objects, "Deployment", "agent-gateway-redis")["spec"]["template"]
        ["spec"]["containers"][0];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let mounted = mounted.display().to_string();
    assert!(
        container["command"].to_string().contains(&mounted),
        "the Redis container reads its password from the Secret"
    );
    strings(&container["command"])
        .into_iter()
        .chain(strings(&container["args"]))
        .map(|s| s.replace(&mounted, &local.display().to_string()))
        .collect()
}

#[test]
fn the_redis_overlay_is_the_base_with_a_shared_limit_that_works() {
    let base = kustomize(BASE);
    let objects = kustomize(REDIS_OVERLAY);
    assert_recommended_labels(&objects);
    let (_, cfg) = configmap_config(&objects);

    // The same config as the base's, but for [rate_limit].
    let (_, base_cfg) = configmap_config(&base);
    assert_eq!(cfg.rate_limit.backend, RateLimitBackend::Redis);
    assert_eq!(cfg.rate_limit.on_redis_error, OnRedisError::Local);
    let mut expected = base_cfg.clone();
    expected.rate_limit = cfg.rate_limit.clone();
    assert_eq!(cfg.to_toml(), expected.to_toml());
    assert_base_objects_unchanged(&base, &objects, &["Deployment"]);

    // redis_url names the overlay's Redis Service and port, which reach the Redis pod.
    let url = cfg.rate_limit.redis_url.clone().unwrap();
    let service = object(&objects, "Service", "agent-gateway-redis");
    assert_eq!(
        url,
        format!(
            "redis://{}:{}/0",
            service["metadata"]["name"].as_str().unwrap(),
            service["spec"]["ports"][0]["port"]
        )
    );
    let redis = object(&objects, "Deployment", "agent-gateway-redis");
    let redis_pod = &redis["spec"]["template"];
    assert!(selects(
        &service["spec"]["selector"],
        &redis_pod["metadata"]["labels"]
    ));
    let redis_container = &redis_pod["spec"]["containers"][0];
    assert_eq!(
        container_port(redis_container, "redis").to_string(),
        service["spec"]["ports"][0]["port"].to_string()
    );
    assert_eq!(redis_pod["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        redis_container["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    // Only the gateway's pods may reach it, and the gateway's pods are not Redis'.
    let policy = object(&objects, "NetworkPolicy", "agent-gateway-redis");
    let gateway_pod = &object(&objects, "Deployment", "agent-gateway")["spec"]["template"];
    assert!(selects(
        &policy["spec"]["podSelector"]["matchLabels"],
        &redis_pod["metadata"]["labels"]
    ));
    let allowed = &policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
    assert!(selects(allowed, &gateway_pod["metadata"]["labels"]));
    assert!(!selects(
        &service["spec"]["selector"],
        &gateway_pod["metadata"]["labels"]
    ));

    // Both read one password, from the Secret both mount where the config names it.
    const AUTH: &str = "agent-gateway-redis-auth";
    let password_file = PathBuf::from(cfg.rate_limit.redis_password_file.clone().unwrap());
    let mounted = password_file.parent().unwrap();
    assert_eq!(secret_mount(&objects, "agent-gateway", AUTH), mounted);
    assert_eq!(secret_mount(&objects, "agent-gateway-redis", AUTH), mounted);
    let key = password_file.file_name().unwrap().to_str().unwrap();
    let shipped = secret_value(&objects, AUTH, key);
    // The check its kustomization's comment gives passes (any password will do the gateway).
    let overlay = path(REDIS_OVERLAY);
    let out = check_overlay(
        &overlay,
        &[(mounted.to_str().unwrap(), &overlay.join("redis-auth"))],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The Redis container, run here as the manifest has it: with the shipped placeholder, or
    // a password that is too short, it refuses to start, and says what to do.
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().join(key);
    let run_redis = |password: &str| {
        std::fs::write(&here, password).unwrap();
        let command = redis_command(&objects, mounted, dir.path());
        let port = free_port().to_string();
        std::process::Command::new(&command[0])
            .args(&command[1..])
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .output()
            .unwrap()
    };
    for (password, says) in [
        (shipped.as_str(), "placeholder"),
        ("sixteen-minus-1", "shorter than 16"),
    ] {
        let out = run_redis(password);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "Redis started with {password:?}");
        assert!(stderr.contains(AUTH) && stderr.contains(says), "{stderr}");
    }

    // With a password of the user's, it starts and answers only those who know it.
    let password = "0c5d1e2b7a9f4e3d8c6b5a4f3e2d1c0b";
    std::fs::write(&here, password).unwrap();
    let server = RedisServer::launched_by(redis_command(&objects, mounted, dir.path()), password);
    let mut stranger = ::redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let refused = ::redis::cmd("PING")
        .query::<String>(&mut stranger)
        .expect_err("Redis answered a client without its password");
    assert!(refused.to_string().contains("NOAUTH"), "{refused}");

    // The gateway, its Redis URL pointed here and its password file the Secret's, and an
    // agent of the user's with a rate limit: the limit is decided there.
    let mut gateway = cfg.clone();
    gateway.auth.agents.push(users_agent("team-token"));
    gateway.rate_limit.redis_url = Some(server.url());
    gateway.rate_limit.redis_password_file = Some(here.display().to_string());
    // The overlay's 50 ms is for a Redis beside the pods; a busy test machine needs longer
    // for the decision to be Redis'.
    gateway.rate_limit.timeout_ms = REDIS_TIMEOUT_MS;
    let (gw, _backend) = run_and_probe(&objects, gateway);
    assert_eq!(call_as(&gw, "team-agent", "team-token"), 200);
    gw.wait_for_metric(
        "agent_gateway_rate_limit_decisions_total{backend=\"redis\",result=\"allowed\"}",
        1.0,
    );
    // Redis ran the script (the key is already gone: at 50/s the bucket is full 20 ms later).
    assert!(server.evalsha_calls() >= 1);
}

// ---------------------------------------------------------------------------------------------
// Every kustomization: the files the pods are handed
// ---------------------------------------------------------------------------------------------

/// The base and every overlay under `deploy/kubernetes/overlays`, a new one included.
fn kustomizations() -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(path(OVERLAYS))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").is_file())
        .map(|p| format!("{OVERLAYS}/{}", p.file_name().unwrap().to_str().unwrap()))
        .collect();
    dirs.sort();
    [BASE.to_string()].into_iter().chain(dirs).collect()
}

/// The modes a volume of Secret or ConfigMap files gives them: its `defaultMode` (`None` when
/// it sets none: 0644, world-readable) and each item's own `mode`. Empty for other volumes.
fn file_modes(volume: &Value) -> Vec<Option<u64>> {
    let item_modes = |source: &Value| -> Vec<Option<u64>> {
        source["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i.get("mode").map(|m| m.as_u64()))
            .collect()
    };
    if let Some(projected) = volume.get("projected") {
        let mut modes = vec![projected["defaultMode"].as_u64()];
        for source in projected["sources"].as_array().into_iter().flatten() {
            for kind in ["secret", "configMap"] {
                modes.extend(item_modes(&source[kind]));
            }
        }
        return modes;
    }
    ["secret", "configMap"]
        .iter()
        .filter_map(|kind| volume.get(*kind))
        .flat_map(|source| {
            [source["defaultMode"].as_u64()]
                .into_iter()
                .chain(item_modes(source))
        })
        .collect()
}

#[test]
fn every_secret_and_configmap_mounted_is_readable_by_its_pods_group_alone() {
    let mut checked = Vec::new();
    for dir in kustomizations() {
        for o in kustomize(&dir) {
            let pod = &o["spec"]["template"]["spec"];
            let Some(volumes) = pod["volumes"].as_array() else {
                continue;
            };
            let object_name = o["metadata"]["name"].as_str().unwrap();
            let what = format!("{dir}: {} {object_name}", o["kind"].as_str().unwrap());
            for volume in volumes {
                let modes = file_modes(volume);
                if modes.is_empty() {
                    continue;
                }
                let name = volume["name"].as_str().unwrap();
                // Not readable by others: a sidecar of another uid, or anything else in the pod.
                for mode in &modes {
                    let mode = mode.unwrap_or_else(|| {
                        panic!("{what}: volume {name} sets no defaultMode (0644: world-readable)")
                    });
                    assert_eq!(mode & 0o007, 0, "{what}: volume {name} mode {mode:#o}");
                    assert_ne!(mode & 0o040, 0, "{what}: volume {name} mode {mode:#o}");
                }
                // Readable by its readers through the pod's fsGroup (the kubelet gives the
                // files to that group): the group each container mounting it runs as.
                let fs_group = &pod["securityContext"]["fsGroup"];
                assert!(fs_group.is_u64(), "{what}: no fsGroup for volume {name}");
                let containers = ["initContainers", "containers"]
                    .iter()
                    .flat_map(|kind| pod[*kind].as_array().into_iter().flatten());
                for c in containers {
                    let mut mounts = c["volumeMounts"].as_array().into_iter().flatten();
                    if !mounts.any(|m| m["name"] == name) {
                        continue;
                    }
                    let group = c["securityContext"]
                        .get("runAsGroup")
                        .unwrap_or(&pod["securityContext"]["runAsGroup"]);
                    assert_eq!(
                        group, fs_group,
                        "{what}: container {} reads volume {name} as group {group}, \
                         the files are fsGroup {fs_group}'s",
                        c["name"]
                    );
                }
                checked.push((dir.clone(), object_name.to_string(), name.to_string()));
            }
        }
    }
    // The agents, the Redis password (the gateway's mount and Redis'), and the configs.
    for (dir, object, volume) in [
        (BASE, "agent-gateway", "config"),
        (EXAMPLE_OVERLAY, "agent-gateway", "agents"),
        (REDIS_OVERLAY, "agent-gateway", "redis-auth"),
        (REDIS_OVERLAY, "agent-gateway-redis", "auth"),
    ] {
        let want = (dir.to_string(), object.to_string(), volume.to_string());
        assert!(checked.contains(&want), "{want:?} not among {checked:?}");
    }
}
