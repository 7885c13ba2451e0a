// The dashboard's only door to the server: JSON over fetch, with the bearer token.
// The token lives in sessionStorage (gone when the tab closes); a 401 answer raises
// Unauthorized, which the app turns into the login form.

const KEY = "dq-token";

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

// Routes are relative to the page (served at <root>/ui/), so a server mounted under a
// path prefix works too.
const ROOT = new URL("..", document.baseURI);

export async function api(method, path, body, tokenOverride) {
  const headers = { Accept: "application/json" };
  const bearer = tokenOverride ?? token.get();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(new URL(path.replace(/^\//, ""), ROOT), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    // The browser says only "TypeError: Failed to fetch": say what it means here.
    throw new ApiError(0, "unreachable", `cannot reach the server (${err.message})`);
  }
  if (response.status === 401) throw new Unauthorized("a valid bearer token is required");
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    throw new ApiError(response.status, "bad_response", text.slice(0, 200));
  }
  if (!response.ok) {
    throw new ApiError(response.status, data?.error, data?.message ?? text.slice(0, 200));
  }
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body ?? {});
export const put = (path, body) => api("PUT", path, body);
export const del = (path) => api("DELETE", path);

export const q = encodeURIComponent;
