// Media: the caller's microphone. Errors come back as CallError with a message the caller can act on.

import { CallError } from "./signaling.js";

const params = new URLSearchParams(location.search);
const param = (name) => (params.get(name) || "").toLowerCase();

/**
 * ?raw=1 or ?processing=off: hand the server the untouched mic. The browser's echo cancellation, noise
 * suppression and gain control garble synthetic test speech, and hide how the server copes on its own.
 */
export const RAW_MIC =
  (params.has("raw") && !["0", "false", "off", "no"].includes(param("raw"))) || param("processing") === "off";

/** getUserMedia's error name -> what the caller can do about it. */
function micErrorMessage(name) {
  if (/NotAllowed|Security/.test(name)) {
    return "Microphone access was denied. Allow the microphone for this site and try again.";
  }
  if (/NotFound|Overconstrained/.test(name)) return "No microphone was found. Plug one in and try again.";
  if (/NotReadable|Abort/.test(name)) {
    return "Your microphone is busy or unavailable. Close other apps using it and try again.";
  }
  return "Could not open the microphone.";
}

export async function openMic() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    // Browsers only expose the microphone to secure pages (HTTPS, or localhost).
    throw new CallError("The microphone needs a secure page: open Parley over HTTPS or on localhost.");
  }
  const on = !RAW_MIC;
  const audio = { echoCancellation: on, noiseSuppression: on, autoGainControl: on };
  try {
    return await navigator.mediaDevices.getUserMedia({ audio });
  } catch (err) {
    throw new CallError(micErrorMessage(String(err && err.name)));
  }
}

export function stopStream(stream) {
  if (stream) stream.getTracks().forEach((track) => track.stop());
}
