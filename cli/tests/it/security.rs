//! Who is asking, tried as hostile users and impostors would: real Unix users with MUNGE
//! credentials from a real munged, real TLS on 127.0.0.1, forged Raft messages, rogue and
//! duplicate agents.

use crate::common;
#[path = "security/local_user.rs"]
mod local_user;

use std::path::Path;
use std::time::Duration;

use common::*;
use quorum_auth::pki::{Layout, PeerRole};
use quorum_auth::tls::{ClientTls, TlsFiles};
use quorum_dev::cluster::{DevCluster, DevOptions};
use quorum_dev::security::DevSecurity;
use quorum_proto::agent::agent_service_client::AgentServiceClient;
use quorum_proto::agent::{agent_message, AgentMessage, Register};
use quorum_proto::api;
use quorum_proto::api::quorum_client::QuorumClient;
use quorum_proto::raft::raft_service_client::RaftServiceClient;
use tonic::Code;

const T: Duration = Duration::from_secs(30);

fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() == 0 }
}

/// `quorum ARGS` run by Unix user `user` (runuser), proving who it is with its own MUNGE
/// credential, in `dir`.
fn as_user(cluster: &DevCluster, user: &str, dir: &Path, args: &[&str]) -> Run {
    let program = quorum_bin().to_str().expect("a temporary path is UTF-8");
    let all: Vec<&str> = std::iter::once(program).chain(args.iter().copied()).collect();
    local_user::run_as(cluster, user, dir, "022", &[], &all)
}

fn refused(r: &Run, what: &str, want: &str) {
    assert_ne!(r.code, 0, "{what} should be refused: {r:?}");
    assert!(r.stderr.contains(want), "{what}: stderr should say {want:?}: {r:?}");
}

fn submitted(r: &Run) -> u64 {
    assert_eq!(r.code, 0, "{r:?}");
    r.stdout.trim().strip_prefix("Submitted job ").expect(&r.stdout).parse().unwrap()
}

/// A shared directory every test user may write in.
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_act_on_their_own_jobs_only_and_roles_say_who_may_do_more() {
    if !is_root() {
        eprintln!("skipped: the test makes Unix users and runs commands as them, as root");
        return;
    }
    for u in ["alice", "bob", "qop"] {
        ensure_user(u);
    }
    let cluster = cluster(DevOptions { operators: vec!["qop".into()], ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = open_dir();
    let alice = |args: &[&str]| as_user(&cluster, "alice", dir.path(), args);
    let bob = |args: &[&str]| as_user(&cluster, "bob", dir.path(), args);
    let qop = |args: &[&str]| as_user(&cluster, "qop", dir.path(), args);

    let who = alice(&["whoami"]);
    assert!(who.stdout.starts_with("alice (uid "), "{who:?}");
    assert!(who.stdout.contains(": user, by munge"), "{who:?}");

    // Bob's job runs as bob, whatever anyone claims: the name in the request is not read.
    let bob_user = quorum_auth::users::by_name("bob").unwrap();
    let id_job = submitted(&as_user(&cluster, "bob", dir.path(), &["submit", "-o", "id-%j.out", "--", "id", "-u"]));
    let j = wait_state(&c, id_job, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((j.state.as_str(), j.user.as_str()), ("COMPLETED", "bob"), "{j:?}");
    let out = dir.path().join(format!("id-{id_job}.out"));
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), bob_user.uid.to_string());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&out).unwrap().uid(), bob_user.uid, "written as bob");
    // On every node of a multi-node job.
    let two = submitted(&bob(&["submit", "-N", "2", "--every-node", "-o", "two-%j-%N.out", "--", "id", "-u"]));
    assert_eq!(wait_state(&c, two, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    for node in ["node01", "node02"] {
        let text = std::fs::read_to_string(dir.path().join(format!("two-{two}-{node}.out"))).unwrap();
        assert_eq!(text.trim(), bob_user.uid.to_string(), "on {node}");
    }
    let claimed = std::process::Command::new("runuser")
        .args(["-u", "alice", "--"])
        .arg(quorum_bin())
        .args(["submit", "-o", "claim-%j.out", "--", "id", "-u"])
        .envs(cluster.env())
        .env("USER", "root")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let claimed_id: u64 = String::from_utf8_lossy(&claimed.stdout).trim().rsplit(' ').next().unwrap().parse().unwrap();
    let j = wait_state(&c, claimed_id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.user, "alice", "USER=root is not believed");
    let alice_uid = quorum_auth::users::by_name("alice").unwrap().uid;
    let text = std::fs::read_to_string(dir.path().join(format!("claim-{claimed_id}.out"))).unwrap();
    assert_eq!(text.trim(), alice_uid.to_string(), "the job ran as alice, not root");

    // Bob's environment and command are his: alice sees his job, not what is in it.
    let secret = std::process::Command::new("runuser")
        .args(["-u", "bob", "--"])
        .arg(quorum_bin())
        .args(["submit", "--hold", "--", "echo", "bobs-argument"])
        .envs(cluster.env())
        .env("AWS_SECRET_ACCESS_KEY", "bobs-secret-key")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let secret_job: u64 = String::from_utf8_lossy(&secret.stdout).trim().rsplit(' ').next().unwrap().parse().unwrap();
    let spec_as = |user: &'static str| {
        let c = client_as(&cluster.addrs, user);
        async move {
            let req = api::GetJobRequest { job_id: secret_job, stale: false, array_task_id: None };
            let job = c.call(|mut cl| async move { cl.get_job(req).await }).await.unwrap().job.unwrap();
            let spec = job.spec.unwrap();
            format!("{:?} {:?}", spec.env, spec.argv)
        }
    };
    let bobs_view = spec_as("bob").await;
    assert!(bobs_view.contains("bobs-secret-key") && bobs_view.contains("bobs-argument"), "{bobs_view}");
    let alices_view = spec_as("alice").await;
    assert!(!alices_view.contains("bobs-secret-key") && !alices_view.contains("bobs-argument"), "{alices_view}");
    let shown = alice(&["show", "--json", &secret_job.to_string()]);
    assert_eq!(shown.code, 0, "{shown:?}");
    assert!(!shown.stdout.contains("bobs-argument"), "{shown:?}");
    let queue = alice(&["queue", "--all", "--json"]);
    assert!(queue.stdout.contains(&format!("\"id\": {secret_job}")), "{queue:?}");
    assert!(!queue.stdout.contains("bobs-secret-key"), "{queue:?}");

    let running = submitted(&bob(&["submit", "--", "sleep", "300"]));
    wait_state(&c, running, &["RUNNING"], T).await;
    let held = submitted(&bob(&["submit", "--hold", "--", "true"]));
    let (r, h) = (running.to_string(), held.to_string());

    refused(&alice(&["cancel", &r]), "alice cancelling bob's job", "may not change job");
    refused(&alice(&["hold", &r]), "alice holding bob's job", "may not change job");
    refused(&alice(&["release", &h]), "alice releasing bob's job", "may not change job");
    refused(&alice(&["cancel", "--signal", "USR1", &r]), "alice signalling bob's job", "may not signal");
    refused(&alice(&["logs", &r]), "alice reading bob's output", "only its owner or an operator");
    refused(&alice(&["admin", "drain", "node01", "--reason", "mine"]), "alice draining", "needs the operator role");
    refused(&alice(&["admin", "account", "physics"]), "alice changing an account", "needs the admin role");
    refused(&alice(&["admin", "remove-replica", "3"]), "alice removing a replica", "needs the admin role");
    refused(&alice(&["admin", "role", "alice", "admin"]), "alice making herself admin", "needs the admin role");
    refused(&alice(&["token", "--user", "bob"]), "alice minting a token for bob", "may not mint a token for 'bob'");
    assert_eq!(job(&c, running).await.state, "RUNNING", "nothing alice asked happened");
    assert!(cluster_nodes(&c).await.iter().all(|n| n.state != "drain"));

    // An operator acts on any job and drains nodes, but gives no roles.
    refused(&qop(&["admin", "role", "qop", "admin"]), "an operator giving roles", "needs the admin role");
    let root = |args: &[&str]| quorum(&cluster.controllers_env(), dir.path(), args);
    refused(&root(&["admin", "role", &"x".repeat(300), "operator"]), "a 300-byte user name", "1 to 256 bytes");
    refused(&root(&["admin", "role", "a\u{1b}[2J", "operator"]), "a name with escapes", "control character");
    // --gid: root runs a job with another group as its primary one; no one else may.
    let bobs_group = quorum_auth::users::group("bob").unwrap();
    let grouped = submitted(&root(&["submit", "--gid", "bob", "-o", "gid-%j.out", "--", "id", "-g"]));
    assert_eq!(wait_state(&c, grouped, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    let text = std::fs::read_to_string(dir.path().join(format!("gid-{grouped}.out"))).unwrap();
    assert_eq!(text.trim(), bobs_group.gid.to_string(), "root's job ran with group bob");
    refused(
        &alice(&["submit", "--gid", "bob", "--", "true"]),
        "alice asking for --gid",
        "only root may run a job with another group",
    );
    refused(
        &root(&["submit", "--gid", "no-such-group-here", "--", "true"]),
        "an unknown group",
        "invalid --gid 'no-such-group-here'",
    );
    assert_eq!(qop(&["admin", "drain", "node02", "--reason", "maintenance"]).code, 0);
    assert_eq!(qop(&["admin", "resume", "node02"]).code, 0);
    assert_eq!(qop(&["cancel", &r]).code, 0);
    assert_eq!(wait_state(&c, running, &["CANCELLED"], T).await.state, "CANCELLED");

    // Roles given at run time, through Raft, by an admin (root, uid 0).
    assert_eq!(quorum(&cluster.controllers_env(), dir.path(), &["admin", "role", "alice", "operator"]).code, 0);
    assert_eq!(alice(&["release", &h]).code, 0, "alice, operator now, releases bob's job");
    assert!(alice(&["whoami"]).stdout.contains(": operator, by munge"));
    assert_eq!(quorum(&cluster.controllers_env(), dir.path(), &["admin", "role", "alice", "user"]).code, 0);
    refused(&alice(&["hold", &h]), "alice, a user again", "may not change job");

    // A token alice asks for works without MUNGE, as alice only.
    let t = alice(&["token", "--lifespan", "10m"]);
    let token = t.stdout.trim().strip_prefix("QUORUM_TOKEN=").expect(&t.stdout).to_string();
    let by_token = std::process::Command::new(quorum_bin())
        .arg("whoami")
        .envs(cluster.env())
        .env("QUORUM_TOKEN", &token)
        .env("QUORUM_MUNGE_SOCKET", "/nonexistent")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&by_token.stdout);
    assert!(said.starts_with("alice (uid ") && said.contains("by token"), "{said}");
    cluster.shutdown().await;
}

async fn cluster_nodes(c: &quorum_client::client::Client) -> Vec<api::NodeInfo> {
    c.call(|mut cl| async move { cl.list_nodes(api::ListNodesRequest::default()).await }).await.unwrap().nodes
}

/// A TLS client of `addr` with this certificate (or none), proving nothing else.
async fn channel(addr: &str, tls: &ClientTls) -> tonic::transport::Channel {
    quorum_auth::tls::endpoint(addr, Some(tls)).unwrap().connect().await.expect("a TLS connection")
}

fn with_cert(role: &PeerRole) -> ClientTls {
    let shared = DevSecurity::shared();
    shared.ensure(role).unwrap();
    let layout = Layout::new(shared.certs_dir());
    let (cert, key) = layout.pair(role);
    TlsFiles { ca: layout.ca(), cert, key }.client().unwrap()
}

fn munge_metadata<T>(req: &mut tonic::Request<T>, cred: &str) {
    req.metadata_mut().insert("authorization", format!("MUNGE {cred}").parse().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impostors_are_refused_at_every_port_and_change_nothing() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let leader = wait_for(T, "a leader", || async { cluster.leader() }).await;
    let term = cluster.controller(leader).unwrap().replica.raft.metrics().borrow().current_term;
    let before = cluster.controller(leader).unwrap().replica.shared.read().state.clone();
    let addr = cluster.addrs[leader].clone();
    let shared = DevSecurity::shared();
    let anonymous = shared.client().tls.unwrap();
    let tool = with_cert(&PeerRole::Client("tool".into()));

    // The Raft service: nobody but a replica's certificate, whatever the payload says.
    let forged =
        quorum_proto::raft::RaftPayload { payload: br#"{"vote":{"leader_id":{"term":999,"node_id":9}}}"#.to_vec() };
    for tls in [&anonymous, &tool] {
        let mut raft = RaftServiceClient::new(channel(&addr, tls).await);
        for e in [raft.append_entries(forged.clone()).await.unwrap_err(), raft.vote(forged.clone()).await.unwrap_err()]
        {
            assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
            assert!(e.message().contains("for replicas only"), "{e:?}");
        }
    }
    // Campaign is for replicas, even from root with a good credential.
    for _ in 0..5 {
        let mut api = QuorumClient::new(channel(&addr, &tool).await);
        let mut req = tonic::Request::new(api::CampaignRequest {});
        munge_metadata(
            &mut req,
            &quorum_auth::munge::Munge::new(Some(shared.munge_socket())).restrict_to(0).credential().unwrap(),
        );
        assert_eq!(api.campaign(req).await.unwrap_err().code(), Code::PermissionDenied);
    }
    // Plaintext to a TLS port gets no answer at all.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
    let e = QuorumClient::new(plain).who_am_i(api::WhoAmIRequest {}).await.unwrap_err();
    assert_ne!(e.code(), Code::Ok, "{e:?}");
    // A certificate of another CA does not get through the handshake.
    let foreign_dir = tempfile::tempdir().unwrap();
    let foreign = Layout::new(foreign_dir.path());
    foreign.init().unwrap();
    let (cert, key) = foreign.issue(&PeerRole::Replica(1), &[]).unwrap();
    let impostor = TlsFiles { ca: shared.ca(), cert, key }.client().unwrap();
    let endpoint = quorum_auth::tls::endpoint(&addr, Some(&impostor)).unwrap();
    let refused = match endpoint.connect().await {
        Err(_) => true,
        Ok(ch) => RaftServiceClient::new(ch).vote(forged.clone()).await.is_err(),
    };
    assert!(refused, "a replica certificate from another CA was accepted");

    // Credentials: none, replayed, a token from an unknown key; a forwarded identity from a
    // client certificate.
    let mut api = QuorumClient::new(channel(&addr, &anonymous).await);
    let e = api.who_am_i(api::WhoAmIRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("no credential"), "{e:?}");
    let cred = quorum_auth::munge::Munge::new(Some(shared.munge_socket())).restrict_to(0).credential().unwrap();
    let mut once = tonic::Request::new(api::WhoAmIRequest {});
    munge_metadata(&mut once, &cred);
    assert_eq!(api.who_am_i(once).await.unwrap().into_inner().user, "root");
    // Sent again on the connection that proved it, it is the same client; on any other
    // connection it is a replay, and munged refuses it.
    let mut again = tonic::Request::new(api::WhoAmIRequest {});
    munge_metadata(&mut again, &cred);
    assert_eq!(api.who_am_i(again).await.unwrap().into_inner().user, "root");
    let mut elsewhere = QuorumClient::new(channel(&addr, &anonymous).await);
    let mut twice = tonic::Request::new(api::WhoAmIRequest {});
    munge_metadata(&mut twice, &cred);
    let e = elsewhere.who_am_i(twice).await.unwrap_err();
    assert!(e.code() == Code::Unauthenticated && e.message().contains("replayed"), "{e:?}");
    let other_key = foreign_dir.path().join("other.key");
    std::fs::write(&other_key, "f".repeat(64)).unwrap();
    let stranger = quorum_auth::token::Tokens::load(&[other_key]).unwrap().mint("root", 1, 1 << 40);
    let mut req = tonic::Request::new(api::WhoAmIRequest {});
    req.metadata_mut().insert("authorization", format!("Bearer {stranger}").parse().unwrap());
    let e = api.who_am_i(req).await.unwrap_err();
    assert!(e.code() == Code::Unauthenticated && e.message().contains("unknown key"), "{e:?}");
    let mut tool_api = QuorumClient::new(channel(&addr, &tool).await);
    let mut req = tonic::Request::new(api::SetNodesDrainedRequest {
        nodes: vec!["node01".into()],
        drain: true,
        reason: "forged".into(),
        ..Default::default()
    });
    req.metadata_mut().insert("x-quorum-user", "root:0:0".parse().unwrap());
    let e = tool_api.set_nodes_drained(req).await.unwrap_err();
    assert!(e.code() == Code::PermissionDenied && e.message().contains("forwarded identity"), "{e:?}");

    // Agents: only as the node the certificate names; none without a certificate.
    let register = |node: &str| AgentMessage {
        msg: Some(agent_message::Msg::Register(Register {
            node: node.into(),
            cpus: 64,
            mem_mb: 1 << 20,
            version: quorum_agent::VERSION.into(),
            ..Default::default()
        })),
    };
    let node01 = with_cert(&PeerRole::Agent("node01".into()));
    for (tls, want) in [(&node01, "the certificate is for node 'node01'"), (&anonymous, "for agents only")] {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(register("node02")).await.unwrap();
        let mut agents = AgentServiceClient::new(channel(&addr, tls).await);
        let e = agents.session(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains(want), "{e:?}");
    }

    // Nothing changed: the same term, the same leader, the same state.
    let replica = &cluster.controller(leader).unwrap().replica;
    assert_eq!(cluster.leader(), Some(leader), "a forged message moved leadership");
    assert_eq!(replica.raft.metrics().borrow().current_term, term);
    let after = replica.shared.read().state.clone();
    assert_eq!(after.nodes, before.nodes, "a refused request changed the nodes");
    assert_eq!(after.jobs.len(), before.jobs.len());
    cluster.shutdown().await;
}

/// Two agents under one name (a copy started by mistake, with the node's certificate): the
/// newer session cuts the older off, and the running job is never launched on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_under_one_name_never_runs_the_nodes_job_again() {
    let cluster = cluster(DevOptions { agents: 1, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let id = submit(&c, spec(&["bash", "-c", "echo $$ > pid; sleep 300"], dir.path())).await;
    wait_state(&c, id, &["RUNNING"], T).await;
    let pid_file = dir.path().join("pid");
    wait_for(T, "the job's pid", || async { pid_file.exists().then_some(()) }).await;

    let twin = Twin::start(&cluster, 0);
    // The twin takes the session (and is taken over in turn): for five seconds, it never runs
    // the job, which goes on running once.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        assert!(twin.running().is_empty(), "the twin agent was sent the node's job: {:?}", twin.running());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(job(&c, id).await.state, "RUNNING");
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap().lines().count(), 1, "the job started twice");

    // Cancelled, it ends: the kill reaches the agent that runs it, whichever has the session.
    assert_eq!(quorum(&cluster.controllers_env(), dir.path(), &["cancel", &id.to_string()]).code, 0);
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    wait_for(Duration::from_secs(30), "the job's process gone", || async move { (!group_alive(pid)).then_some(()) })
        .await;
    twin.stop().await;
    cluster.shutdown().await;
}

/// `private_data = ["jobs"]`: users see their own jobs only, as with Slurm's PrivateData=jobs;
/// operators see all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_jobs_are_seen_by_their_owners_and_operators_only() {
    if !is_root() {
        eprintln!("skipped: the test makes Unix users and runs commands as them, as root");
        return;
    }
    for u in ["alice", "bob", "qop"] {
        ensure_user(u);
    }
    let opts =
        DevOptions { operators: vec!["qop".into()], private_data: vec!["jobs".into()], ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = open_dir();
    let bobs = submitted(&as_user(&cluster, "bob", dir.path(), &["submit", "--hold", "--", "true"]));
    let alices = submitted(&as_user(&cluster, "alice", dir.path(), &["submit", "--hold", "--", "true"]));
    let listed = |user: &str| -> Vec<u64> {
        let q = as_user(&cluster, user, dir.path(), &["queue", "--all", "--json"]);
        assert_eq!(q.code, 0, "{q:?}");
        let v: serde_json::Value = serde_json::from_str(&q.stdout).unwrap();
        v.as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect()
    };
    assert_eq!(listed("alice"), [alices]);
    assert_eq!(listed("bob"), [bobs]);
    assert_eq!(listed("qop"), [bobs, alices]);
    refused(
        &as_user(&cluster, "alice", dir.path(), &["show", &bobs.to_string()]),
        "alice reading bob's private job",
        &format!("job {bobs} does not exist"),
    );
    cluster.shutdown().await;
}
