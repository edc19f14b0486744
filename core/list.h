/* list.h: an intrusive doubly linked list: a ric_link_t inside each member, a ric_list_t holding the ends. */
#ifndef RIC_LIST_H
#define RIC_LIST_H

#include <stddef.h>

typedef struct ric_link_s ric_link_t;
struct ric_link_s {
    ric_link_t *prev, *next;
};

typedef struct {
    ric_link_t *head, *tail;
} ric_list_t;

/* The member whose link is at link. */
#define ric_list_entry(link, type, member) ((type *) (void *) ((char *) (link) - offsetof(type, member)))

/* The first member, or NULL. */
#define ric_list_first(l, type, member) ((l)->head ? ric_list_entry((l)->head, type, member) : NULL)

static inline void
ric_list_push_front(ric_list_t *l, ric_link_t *e)
{
    e->prev = NULL;
    e->next = l->head;
    if (l->head != NULL) {
        l->head->prev = e;
    } else {
        l->tail = e;
    }
    l->head = e;
}

static inline void
ric_list_remove(ric_list_t *l, ric_link_t *e)
{
    if (e->prev != NULL) {
        e->prev->next = e->next;
    } else {
        l->head = e->next;
    }
    if (e->next != NULL) {
        e->next->prev = e->prev;
    } else {
        l->tail = e->prev;
    }
    e->prev = e->next = NULL;
}

#endif /* RIC_LIST_H */
