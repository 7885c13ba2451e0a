// Confirmation dialogs on the page's one <dialog>. With `typed`, the OK button stays
// disabled until the user types that exact text (the queue name, for a purge).

export function confirmAction({ title, message, ok = "OK", typed = null }) {
  const dialog = document.getElementById("confirm");
  const okButton = document.getElementById("confirm-ok");
  const input = document.getElementById("confirm-typed");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-message").textContent = message;
  document.getElementById("confirm-typed-label").hidden = typed === null;
  document.getElementById("confirm-expected").textContent = typed ?? "";
  okButton.textContent = ok;
  input.value = "";
  okButton.disabled = typed !== null;
  input.oninput = () => { okButton.disabled = input.value !== typed; };
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    (typed !== null ? input : okButton).focus();
  });
}
