// The /v1 API, called with the operator's token. The token is kept in
// sessionStorage: it lives as long as this tab and is never sent elsewhere.

const KEY = 'inboxd.token';

/** A call the host has not answered by then is reported, not waited on forever. */
const TIMEOUT_MS = 15000;

export const session = {
  token: () => sessionStorage.getItem(KEY),
  set: (token) => sessionStorage.setItem(KEY, token),
  clear: () => sessionStorage.removeItem(KEY),
};

/** A failed call: the HTTP status (0 when the host did not answer) and the API's message. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }

  /** What the page shows: the status and the API's own words. */
  describe() {
    const names = { 400: 'Bad request', 401: 'Unauthorized', 403: 'Forbidden', 404: 'Not found',
      409: 'Conflict', 413: 'Too large', 422: 'Unprocessable', 503: 'Unavailable' };
    if (this.status === 0) return this.message;
    return `${this.status} ${names[this.status] ?? 'Error'}: ${this.message}`;
  }
}

export async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${session.token() ?? ''}` };
  const init = { method, headers, signal: AbortSignal.timeout(TIMEOUT_MS) };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === 'TimeoutError') {
      throw new ApiError(0, `The host did not answer ${method} ${path} within ${TIMEOUT_MS / 1000} s.`);
    }
    throw new ApiError(0, `The host did not answer (${error.message}).`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.error) || text || response.statusText);
  }
  return data;
}
