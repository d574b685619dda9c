// Shoal's own page in the management UI (issue 27, item 3): IO workers,
// stream offsets and consumer lag, paging to disk, cluster role.
//
// This file is Shoal's (Apache-2.0, as the rest of Shoal), not RabbitMQ's:
// it is loaded through the RabbitMQ UI's extension point (GET
// /api/extensions names it, the page loads js/shoal.js), so that the
// vendored UI in www/ stays unchanged. Its data is GET /api/shoal
// (broker/management/shoal_page.py), its template js/tmpl/shoal.ejs.

dispatcher_add(function(sammy) {
    sammy.get('#/shoal', function() {
        render({'shoal': '/shoal'}, 'shoal', '#/shoal');
    });
});

// A tab beside RabbitMQ's; "monitoring" as the node pages (administrators
// have it too: global.js expand_user_tags).
NAVIGATION['Shoal'] = ['#/shoal', 'monitoring'];

HELP['shoal-connections'] =
    'Client connections the acceptor has handed to this IO worker, those still in their handshake included.';
HELP['shoal-arena'] =
    'Message bodies this IO worker holds in its shared-memory arena, of the arena\'s size. ' +
    'Yellow: past half, where a queue with a backlog pages new messages to disk. ' +
    'Red: past the memory high watermark, where publishers are blocked.';
HELP['shoal-cpu'] =
    'CPU used since the previous request for this page (by anyone); below, the CPU time since the worker started.';
HELP['shoal-lag'] =
    'Messages written to the stream (durable) that the consumer has not been sent yet: next offset minus the consumer\'s offset.';
HELP['shoal-offset'] =
    'The offset the consumer will be sent next.';
HELP['shoal-paged-out'] =
    'Messages of the queue in the IO workers\' paging files, counted as ready; they are paged back in as the queue drains.';
HELP['shoal-paging-bytes'] =
    'Size of the paging files on disk. A worker buffers up to 1 MiB of a file before it writes, ' +
    'and a file keeps the records already paged back in until it is empty and removed.';

// A count, or "-" where there is none (a consumer not started yet).
function shoal_num(n) {
    return (n === null || n === undefined) ? '-' : fmt_num_thousands(n);
}

// The arena bar's colour: yellow past the page out threshold, red past the
// memory alarm's high watermark (both per arena).
function shoal_arena_bar(worker, shoal) {
    var workers = Math.max(shoal.io_workers.length, 1);
    var high = shoal.arena.high_watermark_bytes / workers / worker.arena_bytes;
    var pageOut = shoal.paging.spill_above_arena_bytes / worker.arena_bytes;
    var thresholds = [[high, 'red'], [pageOut, 'yellow']];
    return node_stat_bar('arena_used_bytes', 'arena_bytes', 'arena', worker,
                         fmt_bytes_axis,
                         fmt_color(worker.arena_used_bytes / worker.arena_bytes, thresholds));
}

// As RabbitMQ shows a connection's state (formatters.js fmt_state).
function shoal_worker_state(worker) {
    if (worker.alarms.length > 0) {
        return fmt_state('red', fmt_escape_html(worker.alarms.join(', ')) + ' alarm',
                         'A resource alarm this worker raised: publishers are blocked');
    }
    if (worker.retiring) {
        return fmt_state('yellow', 'retiring', 'Fewer workers were asked for: it drains and exits');
    }
    if (!worker.ready) {
        return fmt_state('grey', 'starting');
    }
    return fmt_state('green', 'running');
}
