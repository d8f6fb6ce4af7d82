"""The training-parity step shared by the model tests: one step on CPU eager and one on graft."""
import graft


def step_both(mc, oc, mg, og, X, Y, xg, yg, loss_fn, i):
    """Runs one training step of each model; asserts the losses agree within 1e-4 relative."""
    oc.zero_grad()
    lc = loss_fn(mc(X), Y)
    lc.backward()
    oc.step()
    og.zero_grad()
    lg = loss_fn(mg(xg), yg)
    lg.backward()
    og.step()
    graft.step()
    a, b = lc.item(), lg.item()
    assert abs(a - b) <= 1e-4 * max(abs(a), 1e-6), (i, a, b)
