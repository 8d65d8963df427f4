// Rolldown settings merged into `jco componentize --bundle`: the WIT imports
// are provided by the host, not by files, so they stay external (silently).
export default {
  external: [/^inboxd:handler\//],
};
