// The console's addresses (#/..., so a reload or a shared link shows the same page): how a
// view names a page, and how the router reads one back. One module both sides import, so the
// views don't import each other to link across.

export const TABS = [
  { id: 'overview', label: 'Overview' },
  { id: 'messages', label: 'Messages' },
  { id: 'groups', label: 'Groups' },
  { id: 'dls', label: 'DLS' },
  { id: 'settings', label: 'Settings' },
];

export const stationHref = (name, tab) =>
  `#/s/${encodeURIComponent(name)}${tab && tab !== 'overview' ? '/' + tab : ''}`;

/** '#/s/orders/groups?group=g' → { view: 'station', name: 'orders', tab: 'groups', params }. */
export function parseHash(hash) {
  const [path = '/', search = ''] = (hash.replace(/^#/, '') || '/').split('?');
  const params = Object.fromEntries(new URLSearchParams(search));
  if (path === '/' || path === '/stations') return { view: 'list' };
  if (path === '/new') return { view: 'new' };
  const m = /^\/s\/([^/]+)(?:\/([a-z]+))?$/.exec(path);
  if (m) {
    let name;
    try {
      name = decodeURIComponent(m[1]);
    } catch {
      return { view: 'missing' };
    }
    const tab = m[2] || 'overview';
    if (TABS.some((t) => t.id === tab)) return { view: 'station', name, tab, params };
  }
  return { view: 'missing' };
}
