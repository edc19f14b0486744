/* io.c: socket operations for plain sockets, behind the ric_io_t vtable that TLS slots under. */
#include "io.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

/* A system call's result as the layer returns it: bytes, RIC_AGAIN with
 * what to wait for, or RIC_ERROR with errno. */
static ssize_t
result(ric_io_t *io, ssize_t r, int want)
{
    if (r >= 0) {
        return r;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        io->want = want;
        return RIC_AGAIN;
    }
    return RIC_ERROR;
}

static ssize_t
plain_read(ric_io_t *io, void *buf, size_t n)
{
    ssize_t r;

    do {
        r = recv(io->fd, buf, n, 0);
    } while (r == -1 && errno == EINTR);
    return result(io, r, RIC_IO_WANT_READ);
}

static ssize_t
plain_writev(ric_io_t *io, const struct iovec *iov, int iovcnt)
{
    struct msghdr mh;
    ssize_t r;

    /* sendmsg, not writev: MSG_NOSIGNAL instead of a SIGPIPE for a peer gone */
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = (struct iovec *) iov;
    mh.msg_iovlen = (size_t) iovcnt;
    do {
        r = sendmsg(io->fd, &mh, MSG_NOSIGNAL);
    } while (r == -1 && errno == EINTR);
    return result(io, r, RIC_IO_WANT_WRITE);
}

static ssize_t
plain_sendfile(ric_io_t *io, int file_fd, off_t *offset, size_t n)
{
    ssize_t r;

    do {
        r = sendfile(io->fd, file_fd, offset, n);
    } while (r == -1 && errno == EINTR);
    return result(io, r, RIC_IO_WANT_WRITE);
}

static int
plain_shutdown_write(ric_io_t *io)
{
    return shutdown(io->fd, SHUT_WR) == 0 ? RIC_OK : RIC_ERROR;
}

static int
plain_peek_alive(ric_io_t *io)
{
    char byte;
    ssize_t r = recv(io->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);

    return r == -1 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

int
ric_io_unread(ric_io_t *io)
{
    char byte;

    return recv(io->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

static void
plain_close(ric_io_t *io)
{
    close(io->fd);
}

const ric_io_ops_t ric_io_plain = {
    "plain", plain_read, plain_writev, plain_sendfile, plain_shutdown_write, plain_peek_alive,
    NULL, plain_close
};

void
ric_io_init_plain(ric_io_t *io, int fd)
{
    io->fd = fd;
    io->ops = &ric_io_plain;
    io->want = 0;
    io->dry = 0;
    io->tls = NULL;
}

ssize_t
ric_io_write(ric_io_t *io, const void *buf, size_t n)
{
    struct iovec iov;

    iov.iov_base = (void *) buf;
    iov.iov_len = n;
    return io->ops->writev(io, &iov, 1);
}

ssize_t
ric_io_sendfile(ric_io_t *io, int file_fd, off_t *offset, size_t n)
{
    u_char buf[16 * 1024];
    ssize_t got, sent;

    if (io->ops->sendfile != NULL) {
        return io->ops->sendfile(io, file_fd, offset, n);
    }
    /* a kind that encrypts: the bytes pass through user space */
    got = pread(file_fd, buf, ric_min(n, sizeof(buf)), *offset);
    if (got <= 0) {
        return got == 0 ? 0 : RIC_ERROR;
    }
    sent = ric_io_write(io, buf, (size_t) got);
    if (sent > 0) {
        *offset += sent;
    }
    return sent;
}

/* --- splicing ---------------------------------------------------------------- */

/* A pipe holds 64 KiB by default. One the kernel made smaller (the user
 * is past pipe-user-pages-soft, counted over all its processes) is not
 * used: the body is copied instead, as before splicing. */
#define PIPE_MIN (64 * 1024)

static ric_keep_t pipes = RIC_KEEP(32);

ric_pipe_t *
ric_pipe_get(void)
{
    ric_pipe_t *p = ric_keep_take(&pipes);
    int size;

    if (p != NULL) {
        return p;
    }
    p = ric_xmalloc(sizeof(*p));
    if (pipe2(p->fd, O_NONBLOCK | O_CLOEXEC) == -1) {
        free(p);
        return NULL;
    }
    size = fcntl(p->fd[1], F_GETPIPE_SZ);
    if (size < PIPE_MIN) {
        close(p->fd[0]);
        close(p->fd[1]);
        free(p);
        return NULL;
    }
    p->size = (size_t) size;
    p->len = 0;
    return p;
}

void
ric_pipe_keep(int max)
{
    pipes.max = max;
}

void
ric_pipe_put(ric_pipe_t *p)
{
    if (p == NULL) {
        return;
    }
    if (p->len == 0 && ric_keep_give(&pipes, p)) {
        return;
    }
    close(p->fd[0]);
    close(p->fd[1]);
    free(p);
}

ssize_t
ric_io_splice_in(ric_io_t *io, ric_pipe_t *p, size_t max)
{
    ssize_t r;

    max = ric_min(max, p->size - p->len);
    if (max == 0) {
        io->want = RIC_IO_WANT_READ;
        return RIC_AGAIN;
    }
    do {
        r = splice(io->fd, NULL, p->fd[1], NULL, max, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    } while (r == -1 && errno == EINTR);
    if (r > 0) {
        p->len += (size_t) r;
    }
    return result(io, r, RIC_IO_WANT_READ);
}

ssize_t
ric_io_splice_out(ric_io_t *io, ric_pipe_t *p)
{
    ssize_t r;

    do {
        r = splice(p->fd[0], NULL, io->fd, NULL, p->len, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    } while (r == -1 && errno == EINTR);
    if (r > 0) {
        p->len -= (size_t) r;
    }
    return result(io, r, RIC_IO_WANT_WRITE);
}

void
ric_io_close(ric_io_t *io)
{
    if (io->fd != -1) {
        io->ops->close(io);
        io->fd = -1;
    }
}

/* TCP_NODELAY on a listening socket: every connection accepted from it
 * has it from the start (Linux copies it), no system call per accept. */
static void
listen_nodelay(int fd, int family)
{
    int one = 1;

    if (family == AF_INET || family == AF_INET6) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
}

int
ric_io_listen(const struct sockaddr *sa, socklen_t len, int backlog, const char **what)
{
    int fd, one = 1, saved;

    *what = "socket";
    fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd == -1) {
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (sa->sa_family == AF_INET6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    }
    listen_nodelay(fd, sa->sa_family);
    *what = "bind";
    if (bind(fd, sa, len) == 0) {
        *what = "listen";
        if (listen(fd, backlog) == 0) {
            return fd;
        }
    }
    saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

int
ric_io_listen_inherit(int fd)
{
    int flags = fcntl(fd, F_GETFD);

    return flags != -1 && fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) != -1 ? RIC_OK : RIC_ERROR;
}

int
ric_io_listen_adopt(int fd, struct sockaddr_storage *ss, socklen_t *len)
{
    int on = 0, type = 0, flags;
    socklen_t n = sizeof(on);

    *len = sizeof(*ss);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &n) != 0 || !on
        || (n = sizeof(type), getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &n)) != 0
        || type != SOCK_STREAM || getsockname(fd, (struct sockaddr *) ss, len) != 0) {
        return RIC_ERROR;
    }
    listen_nodelay(fd, ss->ss_family); /* an older binary's socket may lack it */
    /* ours again: not passed on to what this process runs next */
    flags = fcntl(fd, F_GETFD);
    return flags != -1 && fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != -1 ? RIC_OK : RIC_ERROR;
}

int
ric_io_accept(int listen_fd, struct sockaddr_storage *ss, socklen_t *len)
{
    int fd;

    *len = sizeof(*ss);
    fd = accept4(listen_fd, (struct sockaddr *) ss, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd == -1 && (errno == EINTR || errno == ECONNABORTED || errno == EWOULDBLOCK)) {
        errno = EAGAIN; /* another worker took it, or the client gave up */
    }
    return fd;
}

int
ric_io_connect(ric_io_t *io, const struct sockaddr *sa, socklen_t len)
{
    int fd, saved;

    fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd == -1) {
        return RIC_ERROR;
    }
    ric_io_init_plain(io, fd);
    ric_io_nodelay(io);
    if (connect(fd, sa, len) == -1 && errno != EINPROGRESS) {
        saved = errno;
        close(fd);
        io->fd = -1;
        errno = saved;
        return RIC_ERROR;
    }
    return RIC_OK;
}

int
ric_io_connect_error(ric_io_t *io)
{
    int err = 0;
    socklen_t len = sizeof(err);

    if (getsockopt(io->fd, SOL_SOCKET, SO_ERROR, &err, &len) == -1) {
        return errno;
    }
    return err;
}

void
ric_io_nodelay(ric_io_t *io)
{
    int one = 1;

    setsockopt(io->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void
ric_io_quickack(ric_io_t *io)
{
    int one = 1;

    setsockopt(io->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
}

void
ric_io_arm(ric_io_t *io, struct event *ev, const struct timeval *tv)
{
    event_add(ev, tv); /* re-adding an added event only moves its timer: no epoll_ctl */
    if (tv == NULL) {
        event_remove_timer(ev);
    }
    if (event_get_events(ev) & EV_READ) {
        ric_io_kick(io, ev);
    }
}

void
ric_io_kick(ric_io_t *io, struct event *ev)
{
    if (ric_io_pending(io)) {
        event_active(ev, EV_READ, 0); /* the rest of a TLS record: no event would come */
    }
}
