/* ----------------------------------------------------------------------
   ML-TORCH tests of the i-PI server's protocol and security (fix
   torch/finetune `teacher ipi`): who may be the client, limits on replies,
   the socket file, IPv4 and IPv6, periodic boundaries, close-on-exec, a
   second client. Peers are unittest/ipi_peer.py (the standard library
   only, so that it also runs as another user) and ASE's SocketClient
   (unittest/ipi_client.py), started by rank 0. ctest runs these on one
   rank (IpiProtocol: what they test is the server, on the replica's first
   rank) under a short TIMEOUT: a hang fails them.
------------------------------------------------------------------------- */

#include "ipi_fixtures.h"

#include <cstring>
#include <dirent.h>
#include <fstream>
#include <map>
#include <sstream>
#include <sys/socket.h>
#include <sys/un.h>

namespace {

const std::string peer_source = ML_TORCH_TEST_DIR "/ipi_peer.py";

std::string read_text(const std::string &path)
{
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// the peer script where any user can read it (the checkout may not be)
std::string peer_script()
{
  static const std::string path = "/tmp/mlt_ipi_peer_" + std::to_string(getpid()) + ".py";
  if (!file_exists(path)) {
    std::ofstream(path) << read_text(peer_source);
    ::chmod(path.c_str(), 0644);
  }
  return path;
}

std::vector<std::string> peer(const std::vector<std::string> &args, bool other_user = false)
{
  std::vector<std::string> a;
  if (other_user) a = {"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"};
  a.insert(a.end(), {"/usr/bin/python3", peer_script()});
  a.insert(a.end(), args.begin(), args.end());
  return a;
}

// finetune_run with `teacher_timeout` seconds and the log written to `log`
std::vector<std::string> run_logged(const std::string &teacher, const std::string &log,
                                    double timeout, const std::string &extra = "",
                                    const std::string &boundary = "")
{
  auto c = finetune_run(teacher, "ortho", extra);
  for (auto &s : c)
    if (s.find("teacher_timeout 60") != std::string::npos)
      s.replace(s.find("teacher_timeout 60"), 18, "teacher_timeout " + std::to_string(timeout));
  c.insert(c.begin(), "log " + log);
  if (!boundary.empty()) c.insert(c.begin() + 2, "boundary " + boundary);
  return c;
}

bool contains(const std::string &text, const std::string &what)
{
  return text.find(what) != std::string::npos;
}

// a TCP port of this test process (tests may run side by side)
int test_port(int k)
{
  return 20000 + static_cast<int>(getpid() % 20000) * 2 + k;
}

bool root()
{
  return ::geteuid() == 0;
}

}    // namespace

/* ----------------------------------------------------------------------
   review item 2: whoever connects first does not become the client. A
   silent peer, a probe and a peer that answers no i-PI header connect
   before the real client; the real client is served at once (peers are
   heard side by side), the others are dropped and named in the log
------------------------------------------------------------------------- */

TEST(IpiProtocol, PeersThatAreNoClientsHoldUpNoOne)
{
  const std::string name = socket_name("peers"), dir = "/tmp/" + name;
  ::mkdir(dir.c_str(), 0755);
  const double t0 = MPI_Wtime();
  {
    Client silent(peer({"silent", "--unix", name, "--hold", "60"}), dir + "/silent.log");
    Client probe(peer({"probe", "--unix", name}), dir + "/probe.log");
    Client hello(peer({"hello", "--unix", name}), dir + "/hello.log");
    Client client(ase_client(name, 64, {"--after", "0.5"}), dir + "/client.log");
    Lammps l;
    l.cmds(run_logged("teacher ipi \"" + name + " 0 unix\"", dir + "/log.lammps", 20));
    EXPECT_EQ(l.fix()->updates(), 8);
  }
  const double took = MPI_Wtime() - t0;
  if (me == 0) {
    const std::string log = read_text(dir + "/log.lammps");
    std::printf("[ ipi peers ] 3 peers before the client: 8 updates in %.1f s\n%s", took,
                log.substr(log.find("fix torch/finetune: teacher ipi")).substr(0, 1500).c_str());
    EXPECT_TRUE(contains(log, "that closed the connection before it answered STATUS") ||
                contains(log, "that failed before it answered STATUS"))
        << log;
    EXPECT_TRUE(contains(log, "that answered STATUS with 'HELLO', not READY or NEEDINIT")) << log;
    EXPECT_TRUE(contains(log, "that had not answered STATUS when the client (pid ")) << log;
    EXPECT_TRUE(contains(log, "client connected on /tmp/ipi_" + name + " (pid ")) << log;
    // the silent peer cost nothing: no reply limit (20 s) was waited for
    EXPECT_LT(took, 15.0);
    std::system(("rm -rf " + dir).c_str());
  }
}

TEST(IpiProtocol, SilentPeerAloneTimesOut)
{
  const std::string name = socket_name("silent");
  Client silent(peer({"silent", "--unix", name, "--hold", "10"}));
  Lammps l;
  const std::string err = l.error_of(run_logged("teacher ipi \"" + name + " 0 unix\"", "none", 2));
  if (me == 0) std::printf("[ ipi silent ] %s\n", err.c_str());
  EXPECT_TRUE(contains(err, "no i-PI client connected to /tmp/ipi_" + name +
                                " within 2 s (a peer connected and did not answer STATUS: pid "))
      << err;
  EXPECT_TRUE(contains(err, "or raise teacher_timeout")) << err;
}

/* ----------------------------------------------------------------------
   review item 1: replies are due within the reply limit (teacher_timeout
   when below 60 s): a client that stops answering STATUS, or announces an
   extra string and sends none, is an ERROR, not a hang
------------------------------------------------------------------------- */

TEST(IpiProtocol, ClientThatStopsAnsweringIsAnError)
{
  const std::string name = socket_name("hang");
  Client hang(peer({"client", "--unix", name, "--hang-after", "2", "--hold", "20"}));
  Lammps l;
  const double t0 = MPI_Wtime();
  const std::string err = l.error_of(run_logged("teacher ipi \"" + name + " 0 unix\"", "none", 3));
  const double took = MPI_Wtime() - t0;
  if (me == 0) std::printf("[ ipi hang ] after %.1f s: %s\n", took, err.c_str());
  EXPECT_TRUE(contains(err, "sent no reply to STATUS within 3 s (an i-PI client answers at once)")) << err;
  EXPECT_TRUE(contains(err, "(on step 6)")) << err;    // labels on steps 2 and 4
  EXPECT_FALSE(contains(err, "raise teacher_timeout")) << err;
  EXPECT_EQ(l.fix()->updates(), 2);
  EXPECT_LT(took, 12.0);
}

TEST(IpiProtocol, ExtraStringNeverSentIsAnError)
{
  const std::string name = socket_name("extra");
  Client extra(peer({"client", "--unix", name, "--extra-hang", "--hold", "20"}));
  Lammps l;
  const std::string err = l.error_of(run_logged("teacher ipi \"" + name + " 0 unix\"", "none", 3));
  if (me == 0) std::printf("[ ipi extra ] %s\n", err.c_str());
  EXPECT_TRUE(contains(err, "sent no reply to GETFORCE (its extra string) within 3 s")) << err;
  EXPECT_EQ(l.fix()->updates(), 0);
}

/* ----------------------------------------------------------------------
   review item 3: the socket file is the user's only, peers of other users
   are refused (on the Unix socket by the file's mode, on TCP loopback by
   the owner of the peer's socket), and the log names the client. As root
   (CI), the other user is nobody: it feeds 0.3 Ha/Bohr on every atom, as
   in the review, and none of it reaches the training
------------------------------------------------------------------------- */

TEST(IpiProtocol, OtherUsersCannotFeedLabels)
{
  if (!root()) GTEST_SKIP() << "needs root to run a peer as another user";
  const std::string name = socket_name("user"), dir = "/tmp/" + name;
  ::mkdir(dir.c_str(), 0755);
  const int port = test_port(0);
  {
    // Unix socket: the file is 0600, so nobody cannot even connect
    Client feeder(peer({"client", "--unix", name, "--force", "0.3"}, true), dir + "/unix_feeder.log");
    Client client(ase_client(name, 64, {"--after", "1.0"}));
    Lammps l;
    l.cmds(run_logged("teacher ipi \"" + name + " 0 unix\"", dir + "/unix.log", 20, "", ""));
    struct stat st{};
    if (me == 0) {
      ASSERT_EQ(::stat(("/tmp/ipi_" + name).c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 0777, 0600u);
    }
    EXPECT_EQ(l.fix()->updates(), 8);
    EXPECT_LT(max_abs(labels_of(l, MPI_COMM_WORLD).f), 5.0);    // LJ's, not 0.3 Ha/Bohr = 15 eV/A
  }
  {
    // TCP on loopback: nobody connects first and is refused by its user
    Client feeder(peer({"client", "--tcp", "127.0.0.1", std::to_string(port), "--force", "0.3"}, true),
                  dir + "/tcp_feeder.log");
    Client client(ase_client("127.0.0.1", 64, {"--port", std::to_string(port), "--after", "1.0"}));
    Lammps l;
    l.cmds(run_logged("teacher ipi \"localhost " + std::to_string(port) + "\"", dir + "/tcp.log", 20));
    EXPECT_EQ(l.fix()->updates(), 8);
    EXPECT_LT(max_abs(labels_of(l, MPI_COMM_WORLD).f), 5.0);
  }
  if (me == 0) {
    const std::string unix_feeder = read_text(dir + "/unix_feeder.log");
    const std::string tcp_log = read_text(dir + "/tcp.log");
    std::printf("[ ipi user ] nobody on the Unix socket: %s[ ipi user ] %s\n", unix_feeder.c_str(),
                tcp_log.substr(tcp_log.find("refused a peer")).substr(0, 300).c_str());
    EXPECT_TRUE(contains(unix_feeder, "refused: Permission denied")) << unix_feeder;
    EXPECT_TRUE(contains(tcp_log, "refused a peer of another user (127.0.0.1:")) << tcp_log;
    EXPECT_TRUE(contains(tcp_log, ", user nobody) on localhost:" + std::to_string(port))) << tcp_log;
    EXPECT_TRUE(contains(tcp_log, "client connected on localhost:" + std::to_string(port) +
                                      " (127.0.0.1:")) << tcp_log;
    EXPECT_TRUE(contains(tcp_log, ", user root)")) << tcp_log;
    std::system(("rm -rf " + dir).c_str());
  }
}

/* ----------------------------------------------------------------------
   review item 4: IPv6 (::1) is served as IPv4 is; over TCP the connection
   has keepalive (its timer shows in /proc/net/tcp6 while the client is
   idle: a client machine that dies is found), and an address other
   machines can reach gets a WARNING
------------------------------------------------------------------------- */

// the timer field of the server's side of a connection on `port` in
// /proc/net/tcp6 (e.g. "02:0000EA5F": 2 is the keepalive timer)
static std::string tcp6_timer_of_port(int port)
{
  char want[8];
  std::snprintf(want, sizeof(want), ":%04X", port);
  std::ifstream in("/proc/net/tcp6");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string slot, local, remote, state, queues, timer;
    w >> slot >> local >> remote >> state >> queues >> timer;
    if (local.size() > 5 && local.substr(local.size() - 5) == want && state == "01") return timer;
  }
  return "";
}

TEST(IpiProtocol, Ipv6AndKeepalive)
{
  const std::string name = socket_name("v6"), dir = "/tmp/" + name;
  ::mkdir(dir.c_str(), 0755);
  const int port = test_port(1);
  Client client(peer({"client", "--tcp", "::1", std::to_string(port)}), dir + "/client.log");
  Lammps l;
  const std::string err = l.error_of(run_logged("teacher ipi \"::1 " + std::to_string(port) + "\"",
                                                dir + "/log.lammps", 20));
  if (err.find("none of its addresses") != std::string::npos) GTEST_SKIP() << "no IPv6 here: " << err;
  EXPECT_EQ(err, "");
  EXPECT_EQ(l.fix()->updates(), 8);
  if (me == 0) {
    const std::string timer = tcp6_timer_of_port(port);
    const std::string log = read_text(dir + "/log.lammps");
    std::printf("[ ipi v6 ] server side of the connection: timer %s\n", timer.c_str());
    EXPECT_EQ(timer.substr(0, 3), "02:") << "no keepalive timer: " << timer;
    EXPECT_TRUE(contains(log, "client connected on ::1:" + std::to_string(port) + " ([::1]:")) << log;
    EXPECT_FALSE(contains(log, "WARNING")) << log;
  }
  l.cmd("unfix ft");
  if (me == 0) std::system(("rm -rf " + dir).c_str());
}

TEST(IpiProtocol, NetworkAddressIsWarnedAbout)
{
  const std::string name = socket_name("any"), dir = "/tmp/" + name;
  ::mkdir(dir.c_str(), 0755);
  const int port = test_port(2);
  {
    Client client(peer({"client", "--tcp", "127.0.0.1", std::to_string(port)}));
    Lammps l;
    l.cmds(run_logged("teacher ipi \"0.0.0.0 " + std::to_string(port) + "\"", dir + "/log.lammps", 20));
    EXPECT_EQ(l.fix()->updates(), 8);
  }
  if (me == 0) {
    const std::string log = read_text(dir + "/log.lammps");
    EXPECT_TRUE(contains(log, "WARNING: Fix torch/finetune teacher ipi listens on 0.0.0.0:" +
                                  std::to_string(port) + ", which other machines can reach"))
        << log;
    std::system(("rm -rf " + dir).c_str());
  }
}

/* ----------------------------------------------------------------------
   review item 5: non-periodic boundaries are refused, saying why
------------------------------------------------------------------------- */

TEST(IpiProtocol, NonPeriodicBoundariesAreRefused)
{
  for (const char *b : {"s s s", "p p f", "p s p"}) {
    Lammps l;
    const std::string err =
        l.error_of(run_logged("teacher ipi \"" + socket_name("pbc") + " 0 unix\"", "none", 2, "", b));
    EXPECT_TRUE(contains(err, "teacher ipi needs periodic boundaries in x, y and z (boundary p p p)"))
        << b << ": " << err;
  }
  // periodic at the fix, shrink-wrapped at the run: refused at the run
  Lammps l;
  auto c = run_logged("teacher ipi \"" + socket_name("pbc") + " 0 unix\"", "none", 2);
  c.insert(c.end() - 1, "change_box all boundary p p s");
  const std::string err = l.error_of(c);
  EXPECT_TRUE(contains(err, "needs periodic boundaries")) << err;
}

/* ----------------------------------------------------------------------
   review item 6: only a stale socket of this user is replaced; a file, a
   symbolic link and another user's socket are left alone, with an ERROR
------------------------------------------------------------------------- */

TEST(IpiProtocol, OnlyOwnStaleSocketsAreReplaced)
{
  const std::string name = socket_name("file"), path = "/tmp/ipi_" + name;
  const std::string target = "/tmp/" + name + ".target";
  auto err_of = [&]() {
    Lammps l;
    return l.error_of(run_logged("teacher ipi \"" + name + " 0 unix\"", "none", 2));
  };
  if (me == 0) std::ofstream(path) << "a user's file\n";
  MPI_Barrier(MPI_COMM_WORLD);
  std::string err = err_of();
  EXPECT_TRUE(contains(err, path + " exists and is a file, not a socket; it is left as it is")) << err;
  EXPECT_FALSE(contains(err, "raise teacher_timeout")) << err;
  if (me == 0) {
    EXPECT_EQ(read_text(path), "a user's file\n");
    std::remove(path.c_str());
    std::ofstream(target) << "kept\n";
    ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  err = err_of();
  EXPECT_TRUE(contains(err, path + " exists and is a symbolic link, not a socket")) << err;
  if (me == 0) {
    EXPECT_EQ(read_text(target), "kept\n");
    std::remove(path.c_str());
    std::remove(target.c_str());
  }
  if (root()) {
    // a stale socket of another user (nobody)
    if (me == 0) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
      ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)), 0);
      ::close(fd);
      ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    err = err_of();
    EXPECT_TRUE(contains(err, "the i-PI socket " + path + " belongs to user nobody")) << err;
    if (me == 0) {
      EXPECT_TRUE(file_exists(path));
      std::remove(path.c_str());
    }
  }
}

/* ----------------------------------------------------------------------
   review item 7: the server's sockets are close-on-exec, so a child of
   `shell` does not keep the client's connection open
------------------------------------------------------------------------- */

// socket descriptors of this process: fd -> close-on-exec
static std::map<int, bool> socket_fds()
{
  std::map<int, bool> out;
  DIR *d = ::opendir("/proc/self/fd");
  if (!d) return out;
  while (dirent *e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == ::dirfd(d)) continue;
    char link[256] = {0};
    const std::string p = "/proc/self/fd/" + std::string(e->d_name);
    if (::readlink(p.c_str(), link, sizeof(link) - 1) > 0 && std::strncmp(link, "socket:", 7) == 0)
      out[fd] = (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0;
  }
  ::closedir(d);
  return out;
}

TEST(IpiProtocol, SocketsAreCloseOnExec)
{
  const std::string name = socket_name("exec");
  const auto before = socket_fds();
  Client client(ase_client(name, 64));
  Lammps l;
  l.cmds(run_logged("teacher ipi \"" + name + " 0 unix\"", "none", 20));
  ASSERT_EQ(l.fix()->updates(), 8);
  int ours = 0;
  for (const auto &[fd, cloexec] : socket_fds())
    if (!before.count(fd)) {
      ++ours;
      EXPECT_TRUE(cloexec) << "socket descriptor " << fd << " is inherited by children";
    }
  // the listening socket and the client's connection (rank 0 only)
  if (me == 0) EXPECT_GE(ours, 2);
}

/* ----------------------------------------------------------------------
   review item 8: a second client that connects while the first is served
   is sent EXIT and named in the log (it was queued and never told)
------------------------------------------------------------------------- */

TEST(IpiProtocol, SecondClientIsSentExit)
{
  const std::string name = socket_name("second"), dir = "/tmp/" + name;
  ::mkdir(dir.c_str(), 0755);
  {
    Client client(ase_client(name, 64));
    Lammps l;
    l.cmds(run_logged("teacher ipi \"" + name + " 0 unix\"", dir + "/log.lammps", 20));
    {
      Client second(peer({"client", "--unix", name}), dir + "/second.log");
      usleep(700000);    // it connects while the first client is served
      l.cmd("run 4 post no");
    }
    EXPECT_EQ(l.fix()->updates(), 10);
  }
  if (me == 0) {
    const std::string second = read_text(dir + "/second.log");
    const std::string log = read_text(dir + "/log.lammps");
    EXPECT_TRUE(contains(second, "got EXIT")) << second;
    EXPECT_TRUE(contains(log, "a second peer (pid ")) << log;
    EXPECT_TRUE(contains(log, "it was sent EXIT")) << log;
    std::system(("rm -rf " + dir).c_str());
  }
}
