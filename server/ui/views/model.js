// Reading the queue JSON the server sends, in one place: fields that the operations API
// added (paused, rates, dead-letter counters) are read from the queue or its stats,
// and a queue's dead-letter queue is the effective one (`<name>.dlq` by default).

export function deadLetterQueueOf(info) {
  const c = info.config || {};
  if (c.dead_letter_queue) return c.dead_letter_queue;
  return c.max_deliveries ? `${info.name}.dlq`.slice(0, 128) : null;
}

function pick(info, key) {
  return info[key] ?? info.stats?.[key] ?? null;
}

// One flat record per queue for tables and sorting.
export function rows(queues) {
  const byName = new Map(queues.map((qi) => [qi.name, qi]));
  const dlqs = new Set(queues.map(deadLetterQueueOf).filter(Boolean));
  return queues.map((qi) => {
    const s = qi.stats || {};
    const rates = pick(qi, "rates") || {};
    const dlq = deadLetterQueueOf(qi);
    const dlqInfo = dlq ? byName.get(dlq) : null;
    return {
      name: qi.name,
      info: qi,
      paused: Boolean(pick(qi, "paused")),
      pausedSince: pick(qi, "paused_since"),
      isDlq: dlqs.has(qi.name) || qi.name.endsWith(".dlq"),
      pending: s.pending ?? 0,
      due: s.due ?? 0,
      delayed: s.delayed ?? 0,
      leased: s.leased ?? 0,
      // due items the delivery rules hold back (null: a server older than the rules)
      held: s.held ?? null,
      dlq,
      dead: dlq ? dlqInfo?.stats?.pending ?? 0 : null,
      deadLettered: pick(qi, "dead_lettered"),
      oldest: s.oldest_due_age_ms ?? null,
      oldestLease: pick(qi, "oldest_lease_age_ms"),
      enq: rates.enqueue_per_s ?? null,
      deq: rates.dequeue_per_s ?? null,
      rel: rates.release_per_s ?? null,
      segments: s.segments ?? 0,
      bytes: s.bytes_on_disk ?? 0,
    };
  });
}

export function sortRows(list, key, asc) {
  const dir = asc ? 1 : -1;
  return list.sort((a, b) => {
    const x = a[key], y = b[key];
    if (x === y) return a.name < b.name ? -1 : 1;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
}
