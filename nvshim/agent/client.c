/* nvshim-agent-client: hand one create to the resident nvshim agent (docs/agent.md).
 *
 * usage: nvshim-agent-client SOCKET VERSION CONFIG RUNTIME BUNDLE ARG...
 * Sends protocol 1's create (the bundle directory as a descriptor, SCM_RIGHTS) and
 * waits for the reply. Exit 0: config.json is edited, exec RUNTIME; 1: the agent
 * refused the create (its one line is on stderr); 2: not served, for any reason
 * (no agent, a timeout, another version): run the in-process create instead.
 * Touches no descriptor it did not open: the caller's fds pass on to runc.
 *
 * usage: nvshim-agent-client --scan PREFIXES MAJOR SOCKET VERSION CONFIG RUNTIME BUNDLE ARG...
 * The same create, asked only when BUNDLE/config.json can ask nvshim for something: the
 * trampoline's grep done here, one process fewer on every create (docs/agent.md). The
 * spec matches when it holds one of the trampoline's fixed strings, a line of PREFIXES
 * (the compiled annotation prefixes, written as ERE literals) or a match of the ERE
 * MAJOR on its line; whatever this scan cannot judge exactly as grep -E would (a NUL
 * byte, a prefix line with an unescaped ERE character, an unreadable file, a file over
 * 64 MiB) counts as a match: it may ask the agent more often than grep, never less.
 * Exit 3: nothing to ask, run RUNTIME on config.json as it is; otherwise as above.
 *
 * usage: nvshim-agent-client --hook SOCKET VERSION HOOK-ARGV...
 * The createContainer hook of nri-inroot: agent (docs/nri.md): copies the OCI state from
 * stdin into a memfd, sends protocol 1's hook (the state, its "/" as a descriptor).
 * Exit 0: the agent did the in-root work. Anything else: exec HOOK-ARGV (nvshim's Python
 * hook) with the same state on stdin, so that the work is done all the same.
 * Why C (measured, docs/agent.md): a whole round trip with this client costs ~0.5 ms more
 * than exec'ing /bin/true; the interpreter's bare start alone costs ~12 ms more. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define MAGIC "nvshim-agent 1"
#define MAX_REQUEST 65536
#define TIMEOUT_S 10 /* the agent gives up at 8 s, before writing anything */

static char req[MAX_REQUEST], rep[16384];

static int add(size_t *n, const char *s) {
    size_t len = strlen(s) + 1;
    if (*n + len > sizeof req) return -1;
    memcpy(req + *n, s, len);
    *n += len;
    return 0;
}

/* Send req[0..n) with descriptor fd to the agent at path; the reply's status: 0 ok,
 * 1 refused (its line printed), 2 anything else. */
static int ask(const char *path, size_t n, int fd) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timeval tv = {TIMEOUT_S, 0};
    int s;
    if (strlen(path) >= sizeof addr.sun_path) return 2;
    s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) return 2;
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    strcpy(addr.sun_path, path);
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) return 2;
    union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } c;
    memset(&c, 0, sizeof c);
    struct iovec iov = {req, n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.b,
                       .msg_controllen = sizeof c.b};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    if (sendmsg(s, &m, MSG_NOSIGNAL) != (ssize_t)n) return 2;
    ssize_t r = recv(s, rep, sizeof rep, 0);
    close(s);
    /* a reply: MAGIC NUL status NUL message NUL, nothing after */
    if (r < (ssize_t)sizeof MAGIC + 2 || rep[r - 1] || memcmp(rep, MAGIC, sizeof MAGIC))
        return 2;
    const char *status = rep + sizeof MAGIC, *msg = status + strlen(status) + 1;
    if (msg >= rep + r || msg + strlen(msg) + 1 != rep + r) return 2;
    if (!strcmp(status, "ok")) return 0;
    if (!strcmp(status, "refused")) {
        dprintf(2, "nvshim: %s\n", msg);
        return 1;
    }
    return 2;
}

/* --hook SOCKET VERSION HOOK-ARGV...: see the top. The state goes to a memfd first (any
 * size: the fallback reads all of it); a state with a NUL or too long for one request
 * goes to the fallback unasked. */
static int hook(int argc, char **argv) {
    char buf[8192];
    size_t n = 0;
    int ok = 1, root, mem = memfd_create("nvshim-oci-state", MFD_CLOEXEC);
    if (argc < 5) {
        dprintf(2, "nvshim: usage: nvshim-agent-client --hook SOCKET VERSION HOOK-ARGV...\n");
        return 1;
    }
    if (mem >= 0) {
        const char *head[] = {MAGIC, "hook", argv[3]};
        for (int i = 0; i < 3; i++) ok &= add(&n, head[i]) == 0;
        for (;;) {
            ssize_t r = read(0, buf, sizeof buf), w = 0;
            if (r == 0) break;
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) { ok = 0; break; } /* stdin read in part: the fallback needs all of it */
            while (w < r) {
                ssize_t d = write(mem, buf + w, r - w);
                if (d <= 0) { dprintf(2, "nvshim: cannot copy the oci state\n"); return 1; }
                w += d;
            }
            if (memchr(buf, 0, r) || n + r + 1 > sizeof req) ok = 0;
            else memcpy(req + n, buf, r), n += r;
        }
        if (n < sizeof req) req[n++] = 0; else ok = 0;
        if (ok && (root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) >= 0
            && ask(argv[2], n, root) == 0)
            return 0;
        if (lseek(mem, 0, SEEK_SET) != 0 || dup2(mem, 0) != 0) {
            dprintf(2, "nvshim: cannot give the oci state to %s\n", argv[4]);
            return 1;
        }
    }
    execv(argv[4], argv + 4);
    dprintf(2, "nvshim: cannot run %s: %s\n", argv[4], strerror(errno));
    return 1;
}

/* --scan: the trampoline's fixed strings (grep -e, each an ERE that means itself) */
static const char *const FIXED[] = {"NVIDIA_", "CUDA_VERSION", "nvidia-container-devices",
                                    "/dev/nvidia", "nvidia-container-runtime-hook", "\\u",
                                    "\\/"};
#define MAX_SPEC (64 << 20)

/* The whole of the regular file path, NUL-terminated, its length in *n; NULL when it
 * cannot be read as one (missing, not a regular file, over MAX_SPEC, a read error). */
static char *slurp(const char *path, size_t *n) {
    struct stat st;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < MAX_SPEC
        && (buf = malloc((size_t)st.st_size + 1))) {
        for (*n = 0;;) {
            ssize_t r = read(fd, buf + *n, (size_t)st.st_size - *n);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) { free(buf); buf = NULL; break; }
            *n += (size_t)r;
            if (r == 0 || *n == (size_t)st.st_size) break; /* grown since: ask (below) */
        }
        if (buf && *n == (size_t)st.st_size && read(fd, &st, 1) != 0) {
            free(buf); /* longer than fstat said: changing under us */
            buf = NULL;
        }
        if (buf) buf[*n] = 0;
    }
    close(fd);
    return buf;
}

/* Whether prefix line l (n bytes, an ERE literal) occurs in spec: 1 yes or cannot tell
 * exactly (an ERE character not escaped, an empty line: grep -f's empty pattern matches
 * everything), 0 no. */
static int prefix_in(const char *spec, size_t len, const char *l, size_t n) {
    char lit[4096];
    size_t k = 0;
    if (n == 0 || n >= sizeof lit) return 1;
    for (size_t i = 0; i < n; i++) {
        if (l[i] == '\\') {
            if (++i == n) return 1;
            lit[k++] = l[i];
        } else if (strchr(".[]()*+?{}|^$", l[i])) {
            return 1;
        } else {
            lit[k++] = l[i];
        }
    }
    return memmem(spec, len, lit, k) != NULL;
}

/* Whether the ERE major matches a line of spec: only a line with a key "major" (any case)
 * can, from that key on (the ERE starts with it); the line is cut at its end as grep reads
 * it. 1 also when the ERE does not compile (cannot tell). */
static int major_in(char *spec, const char *major) {
    regex_t re;
    int compiled = 0, hit = 0;
    for (char *p = spec; !hit && (p = strchr(p, '"')); p++) {
        if (strncasecmp(p + 1, "major\"", 6)) continue;
        if (!compiled) {
            if (regcomp(&re, major, REG_EXTENDED | REG_NOSUB)) return 1;
            compiled = 1;
        }
        char *end = strchr(p, '\n'), keep = 0;
        if (end) keep = *end, *end = 0;
        hit = regexec(&re, p, 0, NULL, 0) == 0;
        if (end) *end = keep;
    }
    if (compiled) regfree(&re);
    return hit;
}

/* Whether config.json at spec_path can ask nvshim for anything (see the top): 1 or 0. */
static int asks(const char *spec_path, const char *prefixes, const char *major) {
    size_t len = 0, plen = 0;
    int hit = 1;
    char *spec = slurp(spec_path, &len), *pre = NULL;
    if (!spec || memchr(spec, 0, len)) goto out;
    for (size_t i = 0; i < sizeof FIXED / sizeof *FIXED; i++)
        if (memmem(spec, len, FIXED[i], strlen(FIXED[i]))) goto out;
    if (!(pre = slurp(prefixes, &plen)) || memchr(pre, 0, plen)) goto out;
    for (char *l = pre; l < pre + plen;) {
        char *e = memchr(l, '\n', (size_t)(pre + plen - l));
        size_t n = e ? (size_t)(e - l) : (size_t)(pre + plen - l);
        if (prefix_in(spec, len, l, n)) goto out;
        l += n + 1;
    }
    hit = major_in(spec, major);
out:
    free(spec);
    free(pre);
    return hit;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--hook")) return hook(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "--scan")) {
        char spec[4096 + 16];
        if (argc < 10 || strlen(argv[8]) > 4096) return 2;
        snprintf(spec, sizeof spec, "%s/config.json", argv[8][0] ? argv[8] : ".");
        if (!asks(spec, argv[2], argv[3])) return 3;
        argv[3] = argv[0];
        argv += 3;
        argc -= 3;
    }
    struct stat st;
    char gen[96] = "", cwd[4096];
    size_t n = 0;
    int i, dir;
    if (argc < 7) return 2;
    if (stat(argv[3], &st) == 0)
        snprintf(gen, sizeof gen, "%llu:%llu:%lld:%lld", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino, (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
    if (!getcwd(cwd, sizeof cwd)) return 2;
    const char *head[] = {MAGIC, "create", argv[2], argv[3], gen, argv[4], cwd, argv[5]};
    for (i = 0; i < 8; i++) if (add(&n, head[i])) return 2;
    for (i = 6; i < argc; i++) if (add(&n, argv[i])) return 2;
    dir = open(argv[5][0] ? argv[5] : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return 2;
    return ask(argv[1], n, dir);
}
