/* io.h: the one I/O layer: every socket the gateway opens, listens on, accepts, connects, reads, writes, sends a file to, shuts down or peeks at goes through here (hiredis, the Redis client, makes its own socket calls on its connection). */
#ifndef RIC_IO_H
#define RIC_IO_H

#include "ric_core.h"

#include <sys/socket.h>
#include <sys/uio.h>

typedef struct ric_io_s ric_io_t;

/* What a blocked operation waits for. A plain socket waits for what it
 * was doing; a TLS socket may have to read to write (and write to read)
 * during a handshake or renegotiation, and says so here. */
#define RIC_IO_WANT_READ 1
#define RIC_IO_WANT_WRITE 2

/* The operations of one kind of socket (redis's connection type). Each
 * returns bytes moved (0 from read is the end of the stream), RIC_AGAIN
 * when the socket would block (io->want says on what), or RIC_ERROR with
 * errno set. None of them is ever interrupted by EINTR. */
typedef struct {
    const char *name; /* "plain", for logs */
    ssize_t (*read)(ric_io_t *io, void *buf, size_t n);
    ssize_t (*writev)(ric_io_t *io, const struct iovec *iov, int iovcnt);
    /* NULL when the kind cannot hand file pages to the kernel (TLS):
     * ric_io_sendfile then reads the file and writes what it read */
    ssize_t (*sendfile)(ric_io_t *io, int file_fd, off_t *offset, size_t n);
    int (*shutdown_write)(ric_io_t *io);          /* RIC_OK or RIC_ERROR */
    int (*peek_alive)(ric_io_t *io);              /* 1: open and quiet; 0 */
    /* NULL when the kind holds nothing back: whether bytes already taken
     * off the socket wait to be read (a TLS record read in part), which no
     * readable event will announce */
    int (*pending)(ric_io_t *io);
    void (*close)(ric_io_t *io);
} ric_io_ops_t;

struct ric_io_s {
    int fd;
    const ric_io_ops_t *ops;
    int want;  /* after RIC_AGAIN: RIC_IO_WANT_READ or RIC_IO_WANT_WRITE */
    int dry;   /* TLS: the last step waited on the socket (to read or to write) */
    void *tls; /* the TLS session of a TLS socket; NULL for plain */
};

extern const ric_io_ops_t ric_io_plain;

/* Makes io a plain socket on fd (which it owns from now on). */
void ric_io_init_plain(ric_io_t *io, int fd);

static inline ssize_t
ric_io_read(ric_io_t *io, void *buf, size_t n)
{
    return io->ops->read(io, buf, n);
}

static inline ssize_t
ric_io_writev(ric_io_t *io, const struct iovec *iov, int iovcnt)
{
    return io->ops->writev(io, iov, iovcnt);
}

ssize_t ric_io_write(ric_io_t *io, const void *buf, size_t n);

/* Sends up to n bytes of file_fd from *offset (advanced by what was sent).
 * 0 when the file ended early (the caller decides what that means). */
ssize_t ric_io_sendfile(ric_io_t *io, int file_fd, off_t *offset, size_t n);

/* Ends the sending side (a FIN after what was written). */
static inline int
ric_io_shutdown_write(ric_io_t *io)
{
    return io->ops->shutdown_write(io);
}

/* Whether an idle connection is still open with nothing unasked for to
 * read: one non-blocking look, no byte consumed. */
static inline int
ric_io_alive(ric_io_t *io)
{
    return io->ops->peek_alive(io);
}

/* Whether a read would return data the socket no longer signals (the rest
 * of a TLS record): who waits for readability must read at once instead. */
static inline int
ric_io_pending(ric_io_t *io)
{
    return io->ops->pending != NULL && io->ops->pending(io);
}

/* --- splicing: a body moved socket to socket through a pipe, its bytes
 * never copied into user space (Linux splice(2); plain sockets only) --- */

/* A pipe holding len bytes of a body on their way (of size bytes at most). */
typedef struct {
    void *link; /* first: what the process's list of empty pipes writes over (ric_keep_t) */
    int fd[2];
    size_t len;
    size_t size;
} ric_pipe_t;

/* An empty pipe: one kept from before, or a new one. NULL when none can
 * be made (out of descriptors): the caller copies instead. */
ric_pipe_t *ric_pipe_get(void);

/* Gives a pipe back: an empty one is kept for the next body (up to
 * ric_pipe_keep's bound), one with bytes left in it (a body broken off)
 * is closed. */
void ric_pipe_put(ric_pipe_t *p);

/* How many empty pipes a worker keeps (32 until set): as many as its
 * large answers under way at once need, or each would make and close a
 * pipe (pipe2, fcntl, two closes). */
void ric_pipe_keep(int max);

/* Whether io's bytes may be spliced (a plain socket, not TLS). */
static inline int
ric_io_can_splice(const ric_io_t *io)
{
    return io->ops == &ric_io_plain;
}

/* Moves up to max bytes from the socket into the pipe. Bytes moved, 0 at
 * the end of the stream, RIC_AGAIN (nothing to read, or the pipe is full:
 * p->len > 0 says which may be), RIC_ERROR with errno. */
ssize_t ric_io_splice_in(ric_io_t *io, ric_pipe_t *p, size_t max);

/* Moves what the pipe holds to the socket: bytes moved, RIC_AGAIN
 * (io->want: write) or RIC_ERROR with errno. */
ssize_t ric_io_splice_out(ric_io_t *io, ric_pipe_t *p);

/* Whether bytes wait unread in the socket (the kernel's receive queue, TLS
 * records included): a close now would send a reset. An end of stream
 * waiting there is not such a byte. */
int ric_io_unread(ric_io_t *io);

struct event;

/* Every wait on io's socket: arms ev (a read or a write event of it) with
 * tv, or with no time limit when tv is NULL (an earlier timer removed:
 * libevent would keep it); a read event fires at once when io holds bytes
 * the socket no longer signals (ric_io_pending). */
void ric_io_arm(ric_io_t *io, struct event *ev, const struct timeval *tv);

/* Fires the read event ev at once when io holds bytes the socket no longer
 * signals (after a look at the socket took them in); its timer stays. */
void ric_io_kick(ric_io_t *io, struct event *ev);

/* A listening socket bound to sa (non-blocking, SO_REUSEADDR, IPv6 only for
 * an IPv6 address): its fd, or -1 with errno set and *what the call that
 * failed ("socket", "bind", "listen"). The master's, kept across workers. */
int ric_io_listen(const struct sockaddr *sa, socklen_t len, int backlog, const char **what);

/* A listening socket handed to a new binary (a binary upgrade): it stays
 * open across exec. RIC_OK or RIC_ERROR with errno. */
int ric_io_listen_inherit(int fd);

/* A listening socket a binary upgrade handed in: the address it is bound to,
 * if fd is one (a listening stream socket). RIC_OK or RIC_ERROR. */
int ric_io_listen_adopt(int fd, struct sockaddr_storage *ss, socklen_t *len);

/* The next connection waiting on a listening socket, non-blocking: its fd,
 * or -1 with errno set (EAGAIN: none waits; EINTR and ECONNABORTED are
 * reported as EAGAIN). */
int ric_io_accept(int listen_fd, struct sockaddr_storage *ss, socklen_t *len);

/* Opens a non-blocking stream socket on io and starts connecting it to sa.
 * RIC_OK: connected or in progress (the socket turns writable when it is
 * done: ask ric_io_connect_error). RIC_ERROR with errno set and nothing
 * open. */
int ric_io_connect(ric_io_t *io, const struct sockaddr *sa, socklen_t len);

/* After a connect turned writable: 0, or why it failed (an errno value). */
int ric_io_connect_error(ric_io_t *io);

/* Answers are written whole: Nagle must not hold back their tail. */
void ric_io_nodelay(ric_io_t *io);

/* Acknowledges what came at once, not after the delayed-ACK timer (~40 ms):
 * a peer that wrote in two sends under Nagle waits for this ACK before it
 * sends the second. The kernel forgets it (TCP_QUICKACK): asked each time. */
void ric_io_quickack(ric_io_t *io);

/* Closes the socket; io->fd is -1 afterwards. */
void ric_io_close(ric_io_t *io);

#endif /* RIC_IO_H */
