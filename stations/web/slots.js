// Slots for the console's waiting reads (long-polls, SSE responses), shared by its tabs.
//
// A browser opens at most six HTTP/1.1 connections to a server, shared by all its tabs, and a
// waiting read holds one for up to a minute. Six tabs of the console shown at once (two
// windows, two screens), each tailing a station, held all six: every other request of every
// tab waited as long. So at most LIVE_SLOTS tabs hold a waiting read at once, leaving two
// connections for everything else; a tail without a slot looks with a short request instead
// (see `follow` in api.js), and takes a slot once one is free.
//
// A slot is a lease in localStorage, which the tabs of one origin share (Web Locks would be
// exact, but browsers offer them on HTTPS and localhost only, and the console may be served
// over plain HTTP). Its holder renews it every RENEW_MS, so the slot of a tab that went
// without a word (closed, crashed) is free again within LEASE_MS.

export const LIVE_SLOTS = 4;
const KEY = 'stations.live.';
const LEASE_MS = 8000;
const RENEW_MS = 2000;
// Two tabs may take one free slot at the same moment: each reads it back after this long (the
// other's write has reached it by then), and the later write is the one that stands.
const SETTLE_MS = 200;

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function lease(key) {
  try {
    return JSON.parse(localStorage.getItem(key));
  } catch {
    return null;
  }
}

/**
 * One slot, for one waiting read: `take()` resolves true once it is held (false: every slot is
 * held elsewhere); `release()` frees it for good (a take under way then takes nothing).
 * `onLost()`: another tab holds it now (it took the slot at the same moment, or this tab's
 * renewals came later than the lease). Without localStorage, every take succeeds.
 */
export function liveSlot(onLost = () => {}) {
  const id = crypto.getRandomValues(new Uint32Array(2)).join('-');
  let held = null; // the key held
  let over = false;
  let renewing = null;
  const mine = (key) => lease(key)?.id === id;
  const write = (key) => localStorage.setItem(key, JSON.stringify({ id, until: Date.now() + LEASE_MS }));
  // Free: no lease, or one run out. A lease further ahead than any holder writes (the clock
  // was set back since) is run out too: a live holder writes its own again at once.
  const free = (key, now) => {
    const until = lease(key)?.until;
    return !(until > now && until <= now + LEASE_MS);
  };

  function renew() {
    if (!held) return;
    if (!mine(held)) {
      held = null;
      clearInterval(renewing);
      onLost();
      return;
    }
    write(held);
  }

  async function take() {
    if (over) return false;
    if (held) return true;
    try {
      for (let i = 0; i < LIVE_SLOTS; i++) {
        const key = KEY + i;
        if (!free(key, Date.now())) continue;
        write(key);
        await pause(SETTLE_MS);
        if (over) {
          if (mine(key)) localStorage.removeItem(key);
          return false;
        }
        if (!mine(key)) continue;
        held = key;
        renewing = setInterval(renew, RENEW_MS);
        return true;
      }
    } catch {
      return !over; // no localStorage (disabled, or full): no slots to share
    }
    return false;
  }

  function release() {
    over = true;
    clearInterval(renewing);
    try {
      if (held && mine(held)) localStorage.removeItem(held);
    } catch {
      // No localStorage: nothing was held.
    }
    held = null;
  }

  return { take, release };
}
