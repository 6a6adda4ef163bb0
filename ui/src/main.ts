import { mount } from "svelte";
import App from "./App.svelte";
import "./app.css";
import { uiTheme } from "./lib/api";
import { forceTheme, parseTheme } from "./lib/theme";

const target = document.getElementById("app");
if (!target) throw new Error("missing #app element");
// The system's light or dark theme, unless KVLAB_THEME forces one (tests, screenshots).
uiTheme()
  .then((t) => forceTheme(parseTheme(t)))
  .catch(() => {});
export default mount(App, { target });
